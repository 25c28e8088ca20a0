"""What a hybrid model (recurrent layers with a state per sequence: docs/architecture/17-state-cache.md) runs with
today, decided from its transformers config before anything is built: the features that would need a state rolled
back or restored are refused by name, and prefix caching is turned off (a hit would need the state at the hit's
end, which the state slots do not keep yet)."""

from __future__ import annotations

import logging
from typing import Any

from vllm_jax.models.registry import family_of_config

logger = logging.getLogger(__name__)


def has_recurrent_state(hf_config: Any) -> bool:
    family = family_of_config(hf_config)
    return family is not None and family.recurrent_state


def check_hybrid_features(hf_config: Any, features: dict[str, bool]) -> None:
    """Refuse each feature in `features` (name -> on) that a hybrid model cannot run with yet."""
    if not has_recurrent_state(hf_config):
        return
    on = [name for name, enabled in features.items() if enabled]
    if on:
        arch = (getattr(hf_config, "architectures", None) or ["?"])[0]
        raise ValueError(f"{arch} has recurrent layers (a state per sequence), which cannot be combined with "
                         f"{', '.join(on)} yet: a rejected or skipped token would need its state rolled back "
                         f"(docs/architecture/17-state-cache.md)")


def prefix_caching_for(hf_config: Any, enabled: bool) -> bool:
    """Whether prefix caching stays on for this model: off for a hybrid model (logged when it was asked for)."""
    if enabled and has_recurrent_state(hf_config):
        logger.info("prefix caching is off for this hybrid model: its recurrent layers' states are kept per request, "
                    "not at block boundaries (docs/architecture/17-state-cache.md, \"Prefix caching for hybrid "
                    "models\")")
        return False
    return enabled

"""What a hybrid model (recurrent layers with a state per sequence: docs/architecture/17-state-cache.md) runs with
today, decided from its transformers config before anything is built: the features that would need a state rolled
back are refused by name."""

from __future__ import annotations

from typing import Any

from vllm_jax.models.registry import family_of_config


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

"""Model classes by HF `architectures` name: the module to build and how to read its spec from the config.

Where each architecture's weights come from in a checkpoint is the loader's business
(`model_loader/weight_maps.py`, keyed by the same names).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.deepseek import DeepseekLM
from vllm_jax.model.mla_spec import MLA_ARCHITECTURES, mla_spec_from_hf_config
from vllm_jax.model.moe import MoeLM
from vllm_jax.model.moe_spec import MOE_ARCHITECTURES, moe_spec_from_hf_config
from vllm_jax.model.spec import SUPPORTED_ARCHITECTURES, DecoderSpec, spec_from_hf_config


@dataclass(frozen=True)
class ModelEntry:
    model_class: type[DecoderLM]
    spec_from_config: Callable[[Any], DecoderSpec]


MODEL_REGISTRY: dict[str, ModelEntry] = {
    **{arch: ModelEntry(DecoderLM, spec_from_hf_config) for arch in SUPPORTED_ARCHITECTURES},
    **{arch: ModelEntry(MoeLM, moe_spec_from_hf_config) for arch in MOE_ARCHITECTURES},
    **{arch: ModelEntry(DeepseekLM, mla_spec_from_hf_config) for arch in MLA_ARCHITECTURES},
}


def resolve_architecture(hf_config: Any) -> tuple[ModelEntry, DecoderSpec]:
    """(registry entry, spec) for a transformers config; an unknown architecture names the supported ones."""
    architectures = list(getattr(hf_config, "architectures", None) or [])
    arch = next((a for a in architectures if a in MODEL_REGISTRY), None)
    if arch is None:
        raise ValueError(f"unsupported model architecture {architectures or '(none given)'}; "
                         f"supported: {', '.join(MODEL_REGISTRY)}")
    entry = MODEL_REGISTRY[arch]
    return entry, entry.spec_from_config(hf_config)

"""Model classes by HF `architectures` name: the module, how to read its spec, where its weights come from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model_loader.decoder_weights import decoder_param_sources
from vllm_jax.model.moe import MoeLM
from vllm_jax.model.moe_spec import MOE_ARCHITECTURES, moe_spec_from_hf_config
from vllm_jax.model_loader.moe_weights import moe_param_sources
from vllm_jax.model_loader.param_source import ParamSource
from vllm_jax.model.spec import SUPPORTED_ARCHITECTURES, spec_from_hf_config


@dataclass(frozen=True)
class ModelEntry:
    model_class: type
    spec_from_config: Callable[[Any], Any]
    param_sources: Callable[[Any], dict[tuple[str, ...], ParamSource]]


MODEL_REGISTRY: dict[str, ModelEntry] = {
    arch: ModelEntry(DecoderLM, spec_from_hf_config, decoder_param_sources) for arch in SUPPORTED_ARCHITECTURES
}
MODEL_REGISTRY.update({
    arch: ModelEntry(MoeLM, moe_spec_from_hf_config, moe_param_sources) for arch in MOE_ARCHITECTURES
})


def resolve_architecture(hf_config: Any) -> tuple[ModelEntry, Any]:
    """(registry entry, spec) for a transformers config; an unknown architecture names the supported ones."""
    architectures = list(getattr(hf_config, "architectures", None) or [])
    arch = next((a for a in architectures if a in MODEL_REGISTRY), None)
    if arch is None:
        raise ValueError(f"unsupported model architecture {architectures or '(none given)'}; "
                         f"supported: {', '.join(MODEL_REGISTRY)}")
    entry = MODEL_REGISTRY[arch]
    return entry, entry.spec_from_config(hf_config)

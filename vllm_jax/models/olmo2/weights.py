"""OLMo 2's weight map: Llama's plus the post-MLP norm."""

from __future__ import annotations

from vllm_jax.model.spec import DecoderSpec
from vllm_jax.models.llama.weights import decoder_param_sources
from vllm_jax.models.param_source import ParamSource, per_layer


def olmo2_param_sources(spec: DecoderSpec) -> dict[tuple[str, ...], ParamSource]:
    """Llama's map (q_norm / k_norm read from the same names, whole-projection sized) plus the post-MLP norm."""
    sources = decoder_param_sources(spec)
    sources[("layers", "post_feedforward_norm")] = per_layer(
        "model.layers.{layer}.post_feedforward_layernorm.weight", spec.num_layers)
    return sources

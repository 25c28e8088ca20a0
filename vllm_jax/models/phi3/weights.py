"""Phi-3's weight map: Llama's with the fused checkpoint projections read as row ranges."""

from __future__ import annotations

from vllm_jax.model.spec import DecoderSpec
from vllm_jax.models.fused_weights import fused_part
from vllm_jax.models.llama.weights import decoder_param_sources
from vllm_jax.models.param_source import ParamSource


def phi3_param_sources(spec: DecoderSpec) -> dict[tuple[str, ...], ParamSource]:
    """Llama's map with q/k/v read as row ranges of `self_attn.qkv_proj` ([q | k | v], HF [out, in]) and gate/up
    of `mlp.gate_up_proj` ([gate | up]): split at load, so each part is its own param and shards like Llama's."""
    sources = decoder_param_sources(spec)
    n, q, kv, i = spec.num_layers, spec.q_size, spec.kv_size, spec.intermediate_size
    qkv = "model.layers.{layer}.self_attn.qkv_proj.weight"
    gate_up = "model.layers.{layer}.mlp.gate_up_proj.weight"
    for name, template, offset, total in (("q_proj", qkv, 0, q + 2 * kv), ("k_proj", qkv, q, q + 2 * kv),
                                          ("v_proj", qkv, q + kv, q + 2 * kv), ("gate_proj", gate_up, 0, 2 * i),
                                          ("up_proj", gate_up, i, 2 * i)):
        sources[("layers", name)] = fused_part(template, n, offset, total)
    return sources

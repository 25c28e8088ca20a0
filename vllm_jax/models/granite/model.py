"""Granite (GraniteForCausalLM): the Llama decoder with four multipliers (docs/architecture/12-families.md, "Granite").

- `embedding_multiplier`: the embedding output times it (DecoderLM.hidden_states, `spec.embedding_multiplier`);
- `attention_multiplier`: the softmax scale of q.k, instead of head_dim ** -0.5 (`spec.attention_scale`);
- `residual_multiplier`: each residual branch (attention output, MLP output) times it before the add
  (`granite_block`), in the hidden dtype as transformers multiplies it;
- `logits_scaling`: the logits divided by it (`GraniteLM._lm_head`, on the float32 logits).

The weights are Llama's (same tensor names, optional attention / MLP biases), so the Llama weight map and
partition rules apply unchanged.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.layers import LayerContext, Mlp, attention, rms_norm
from vllm_jax.model.spec import DecoderSpec, common_spec_fields, pick_architecture

GRANITE_ARCHITECTURES = ("GraniteForCausalLM",)


def granite_spec_from_hf_config(config: Any) -> DecoderSpec:
    arch = pick_architecture(config, GRANITE_ARCHITECTURES)
    common = common_spec_fields(config, arch)
    logits_scaling = float(getattr(config, "logits_scaling", 1.0))
    if logits_scaling == 0:
        raise ValueError(f"{arch}: logits_scaling must not be 0 (the logits are divided by it)")
    attention_bias = bool(getattr(config, "attention_bias", False))
    return DecoderSpec(
        **common, intermediate_size=config.intermediate_size, qkv_bias=attention_bias, o_bias=attention_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)), qk_norm=False,
        embedding_multiplier=float(getattr(config, "embedding_multiplier", 1.0)),
        attention_scale=float(getattr(config, "attention_multiplier", 1.0)),
        residual_multiplier=float(getattr(config, "residual_multiplier", 1.0)), logits_scaling=logits_scaling)


def granite_block(spec: DecoderSpec, ctx: LayerContext, w: dict, mlp: Mlp, hidden: jax.Array,
                  kv_cache: jax.Array, layer_index: jax.Array | int,
                  window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """layers.decoder_block with each residual branch scaled by `residual_multiplier` before its add."""
    scale = jnp.asarray(spec.residual_multiplier, hidden.dtype)
    x = rms_norm(hidden, w["input_norm"], spec.rms_norm_eps)
    attn, kv_cache = attention(spec, ctx, w, x, kv_cache, layer_index, window)
    hidden = hidden + attn * scale
    hidden = hidden + mlp(rms_norm(hidden, w["post_attention_norm"], spec.rms_norm_eps)) * scale
    return hidden, kv_cache


class GraniteLM(DecoderLM):
    """GraniteForCausalLM: DecoderLM with `granite_block` and the logits divided by `logits_scaling`."""

    block = staticmethod(granite_block)

    def _lm_head(self, last: jax.Array) -> jax.Array:
        return super()._lm_head(last) / jnp.float32(self.spec.logits_scaling)

"""OLMo 2 (Olmo2ForCausalLM): a post-norm variant of the Llama decoder (docs/architecture/12-families.md, "OLMo 2").

What differs from `layers.decoder_block`:

- no norm before attention or the MLP; their outputs are normed instead (`post_attention_norm`,
  `post_feedforward_norm`) and then added to the residual: h = h + norm(attn(h)); h = h + norm(mlp(h));
- q/k norms over the whole projection output ([T, heads * head_dim], weights of that size), before the heads
  are split, not per head as Qwen3's;
- OLMo 2's RMSNorm multiplies the weight in float32 and casts after (Llama's casts first, then multiplies).

Params: the Llama layout without `input_norm`, with `q_norm` [L, q_size], `k_norm` [L, kv_size] and
`post_feedforward_norm` [L, hidden] (replicated under tensor parallelism, like every norm).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from vllm_jax.model.decoder import DecoderLayers, DecoderLM
from vllm_jax.model.layers import LayerContext, Mlp, attend, qkv_outputs
from vllm_jax.model.quantization import Quantization
from vllm_jax.model.spec import DecoderSpec, common_spec_fields, pick_architecture

OLMO2_ARCHITECTURES = ("Olmo2ForCausalLM",)


def olmo2_spec_from_hf_config(config: Any) -> DecoderSpec:
    arch = pick_architecture(config, OLMO2_ARCHITECTURES)
    common = common_spec_fields(config, arch)
    attention_bias = bool(getattr(config, "attention_bias", False))
    # qk_norm stays False: the per-head norm of layers.attention is not OLMo 2's (olmo2_block norms q/k itself)
    return DecoderSpec(**common, intermediate_size=config.intermediate_size, qkv_bias=attention_bias,
                       o_bias=attention_bias, mlp_bias=False, qk_norm=False)


def olmo2_rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """OLMo 2's RMSNorm: normalize in float32, multiply by the weight in float32, then cast back."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * xf).astype(x.dtype)


def olmo2_block(spec: DecoderSpec, ctx: LayerContext, w: dict, mlp: Mlp, hidden: jax.Array,
                kv_cache: jax.Array, layer_index: jax.Array | int,
                window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """One OLMo 2 layer: attention of the un-normed hidden state (q/k normed over the whole projection), its
    output normed and added; then the MLP's output normed and added. -> (hidden, updated kv_cache)."""
    t, eps = hidden.shape[0], spec.rms_norm_eps
    q, k, v = qkv_outputs(spec, w, hidden)
    q, k = olmo2_rms_norm(q, w["q_norm"], eps), olmo2_rms_norm(k, w["k_norm"], eps)
    attn, kv_cache = attend(spec, ctx, w, q.reshape(t, spec.num_heads, spec.head_dim),
                            k.reshape(t, spec.num_kv_heads, spec.head_dim),
                            v.reshape(t, spec.num_kv_heads, spec.head_dim), kv_cache, layer_index, window)
    hidden = hidden + olmo2_rms_norm(attn, w["post_attention_norm"], eps)
    hidden = hidden + olmo2_rms_norm(mlp(hidden), w["post_feedforward_norm"], eps)
    return hidden, kv_cache


class Olmo2Layers(DecoderLayers):
    """DecoderLayers without `input_norm`, with whole-projection q/k norms and `post_feedforward_norm`."""

    def __init__(self, spec: DecoderSpec, dtype, rngs: nnx.Rngs, quant: Quantization | None = None,
                 fuse_qkv: bool = False):
        super().__init__(spec, dtype, rngs, quant, fuse_qkv)
        n = spec.num_layers
        del self.input_norm
        self.q_norm = nnx.Param(jnp.ones((n, spec.q_size), dtype))
        self.k_norm = nnx.Param(jnp.ones((n, spec.kv_size), dtype))
        self.post_feedforward_norm = nnx.Param(jnp.ones((n, spec.hidden_size), dtype))


class Olmo2LM(DecoderLM):
    """Olmo2ForCausalLM: DecoderLM with `Olmo2Layers` and `olmo2_block`. The final norm stays the shared
    `layers.rms_norm`: identical to OLMo 2's in float32; in bfloat16 it rounds before the weight multiply, not
    after (a known difference of one rounding: docs/architecture/12-families.md, "OLMo 2")."""

    layers_class = Olmo2Layers
    block = staticmethod(olmo2_block)

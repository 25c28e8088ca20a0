"""DeepSeek's multi-head latent attention (MLA) as one layer's attention half: its params and its forward.

Per token: q from the hidden state (a plain q_proj, or q_a_proj -> RMS norm -> q_b_proj), split per head into a
no-rope part and a rope part; the compressed KV from kv_a_proj_with_mqa, split into the latent c_kv (RMS-normed)
and one shared rope key. The latent and the rotated rope key are what the cache keeps (one row per token:
pallas_kernels/mla_attention.py). Attention runs in the absorbed form: q_nope is taken into latent space through
W_UK (the key half of kv_b_proj), scores are q_latent . c + q_rope . k_rope, the output comes back out of latent
space through W_UV (the value half), then o_proj. transformers instead expands c into per-head keys and values;
the two are the same sums in another order (within float32 rounding).

Rotary: DeepSeek lays the rope dims out in interleaved pairs (x0, x1), (x2, x3), ... (V2's complex rotation, V3's
apply_rotary_pos_emb_interleave); we rotate the even/odd slices and write the result as halves, as V3 does. V2
keeps the pairs interleaved in its output: the same permutation of q and k, so every score is the same. A V3
config with `rope_interleave` false uses the rotate-half layout.

The norms inside attention (q_a_layernorm, kv_a_layernorm) use eps 1e-6 whatever rms_norm_eps is: transformers
builds them with the RMSNorm default.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vllm_jax.model.layers import LayerContext, Mlp, apply_rotary, init_param, linear, rms_norm
from vllm_jax.models.deepseek.spec import MlaSpec
from vllm_jax.pallas_kernels.mla_attention import write_mla_cache

LATENT_NORM_EPS = 1e-6  # transformers' DeepseekV{2,3}RMSNorm default, used for q_a / kv_a layernorms


def mla_attention_params(spec: MlaSpec, dtype, rngs: nnx.Rngs) -> dict[str, nnx.Param]:
    """Every layer's attention half, stacked on axis 0 (linear weights [in, out])."""
    n, h, heads = spec.num_layers, spec.hidden_size, spec.num_heads
    params = {
        "input_norm": nnx.Param(jnp.ones((n, h), dtype)),
        "post_attention_norm": nnx.Param(jnp.ones((n, h), dtype)),
        "kv_a_proj": init_param(rngs, (n, h, spec.kv_lora_rank + spec.qk_rope_head_dim), dtype),
        "kv_a_norm": nnx.Param(jnp.ones((n, spec.kv_lora_rank), dtype)),
        "kv_b_proj": init_param(rngs, (n, spec.kv_lora_rank, heads * (spec.qk_nope_head_dim + spec.v_head_dim)),
                                dtype),
        "o_proj": init_param(rngs, (n, heads * spec.v_head_dim, h), dtype),
    }
    if spec.q_lora_rank is None:
        params["q_proj"] = init_param(rngs, (n, h, heads * spec.qk_head_dim), dtype)
    else:
        params["q_a_proj"] = init_param(rngs, (n, h, spec.q_lora_rank), dtype)
        params["q_a_norm"] = nnx.Param(jnp.ones((n, spec.q_lora_rank), dtype))
        params["q_b_proj"] = init_param(rngs, (n, spec.q_lora_rank, heads * spec.qk_head_dim), dtype)
    return params


def rotate_interleaved(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotary over interleaved pairs (x[2i], x[2i+1]) by frequency i, written out as halves (transformers'
    apply_rotary_pos_emb_interleave), in float32. x [T, ..., rope]; cos/sin [T, rope] (cat(freqs, freqs))."""
    half = x.shape[-1] // 2
    xf = x.astype(jnp.float32)
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (half,)
    c, s = cos[:, :half].reshape(shape), sin[:, :half].reshape(shape)
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


def _rotate(spec: MlaSpec, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    if spec.rope_interleave:
        return rotate_interleaved(x, cos, sin)
    if x.ndim == 2:
        return apply_rotary(x[:, None, :], cos, sin)[:, 0]
    return apply_rotary(x, cos, sin)


def mla_attention(spec: MlaSpec, ctx: LayerContext, w: dict, x: jax.Array, kv_cache: jax.Array,
                  layer_index: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """MLA of the normed hidden states `x` [T, hidden]: this step's latent rows written through `slot_mapping`
    before the ragged paged attention reads the pages. -> (attention output [T, hidden], updated kv_cache)."""
    t, heads, inputs = x.shape[0], spec.num_heads, ctx.inputs
    nope, rope, rank, v_dim = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.kv_lora_rank, spec.v_head_dim
    if spec.q_lora_rank is None:
        q = linear(x, w["q_proj"])
    else:
        q = linear(rms_norm(linear(x, w["q_a_proj"]), w["q_a_norm"], LATENT_NORM_EPS), w["q_b_proj"])
    q = q.reshape(t, heads, nope + rope)
    q_nope, q_rope = q[..., :nope], q[..., nope:]
    compressed = linear(x, w["kv_a_proj"])
    latent = rms_norm(compressed[:, :rank], w["kv_a_norm"], LATENT_NORM_EPS)
    q_rope = _rotate(spec, q_rope, ctx.cos, ctx.sin)
    k_rope = _rotate(spec, compressed[:, rank:], ctx.cos, ctx.sin)
    kv_cache = write_mla_cache(kv_cache, latent, k_rope, inputs.slot_mapping, layer_index)
    w_kv = w["kv_b_proj"].reshape(rank, heads, nope + v_dim)
    w_uk, w_uv = w_kv[..., :nope], w_kv[..., nope:]
    q_latent = jnp.einsum("thd,rhd->thr", q_nope, w_uk, preferred_element_type=jnp.float32).astype(x.dtype)
    out = ctx.kernels.mla_attention(q_latent, q_rope, kv_cache, inputs, sm_scale=spec.sm_scale,
                                    layer_index=layer_index)
    out = jnp.einsum("thr,rhv->thv", out, w_uv, preferred_element_type=jnp.float32).astype(x.dtype)
    return linear(out.reshape(t, heads * v_dim), w["o_proj"]), kv_cache


def mla_decoder_block(spec: MlaSpec, ctx: LayerContext, w: dict, mlp: Mlp, hidden: jax.Array, kv_cache: jax.Array,
                      layer_index: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """One pre-norm DeepSeek layer: MLA, then `mlp` on the post-attention-normed state, each with its residual."""
    x = rms_norm(hidden, w["input_norm"], spec.rms_norm_eps)
    attn, kv_cache = mla_attention(spec, ctx, w, x, kv_cache, layer_index)
    hidden = hidden + attn
    hidden = hidden + mlp(rms_norm(hidden, w["post_attention_norm"], spec.rms_norm_eps))
    return hidden, kv_cache

"""What the KV cache stores: K / k_scale and V / v_scale in the cache's dtype (docs/architecture/04-kv-cache.md, "KV
cache layout").

A float cache stores K and V as they are (the scales are 1.0). An fp8 cache (`--kv-cache-dtype fp8`) is
float8_e4m3fn: a write divides by the per-tensor scale, saturates to e4m3's finite range (+-448; e4m3fn has no
infinity and a cast of anything larger is NaN) and rounds to nearest even. Every backend writes through
`quantize`, so the three write the same bytes.

Reads dequantize by a cast to the compute dtype (exact: every e4m3 value is a bfloat16 value) and fold the scales
into the attention instead of a pass over the pages: q . (k_scale k) = k_scale (q . k), so k_scale joins the score
scale, and sum p (v_scale v) / sum p = v_scale (sum p v / sum p), so v_scale multiplies the normalized output.
Scales are Python floats baked into the program: vLLM's default is 1.0, and nothing here computes or loads
others yet.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

FP8_DTYPES = (jnp.dtype(jnp.float8_e4m3fn),)


def is_fp8(dtype) -> bool:
    return jnp.dtype(dtype) in FP8_DTYPES


def quantize(x: jax.Array, dtype, scale: float = 1.0) -> jax.Array:
    """`x` / `scale` in the cache dtype `dtype`, saturated to its finite range when it is an fp8 type."""
    dtype = jnp.dtype(dtype)
    if not is_fp8(dtype):
        return (x if scale == 1.0 else x.astype(jnp.float32) / scale).astype(dtype)
    top = float(jnp.finfo(dtype).max)
    x = x.astype(jnp.float32)
    if scale != 1.0:
        x = x / scale
    return jnp.clip(x, -top, top).astype(dtype)


def interleave(k: jax.Array, v: jax.Array, dtype, k_scale: float = 1.0, v_scale: float = 1.0) -> jax.Array:
    """[T, H, D] K and V -> [T, 2H, D] cache rows k0, v0, k1, v1, ..., quantized for a `dtype` cache."""
    num_tokens, num_kv_heads, head_dim = k.shape
    k, v = quantize(k, dtype, k_scale), quantize(v, dtype, v_scale)
    return jnp.stack([k, v], axis=2).reshape(num_tokens, 2 * num_kv_heads, head_dim)


def check_scales(k_scale: float, v_scale: float) -> None:
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive Python float (static); got {value!r}")

"""The pallas_tpu backend's lane-dense KV cache: one row of `num_kv_heads * pair_lanes(head_dim)` lanes per token.

Why (docs/architecture/04-kv-cache.md, "KV cache layout"): the other backends' cache is [.., block_size, 2 * kv_heads,
head_dim]. When head_dim is not a multiple of 128, XLA:TPU gives that array a compact tiled layout with the blocks
dim minor (row-major would pad each [2H, head_dim] page row to (8, 128) tiles), while a Mosaic kernel reads its
operands row-major, so every forward copied the whole cache. Here each token's row is lane-dense: KV head h owns
the 128-aligned lanes [h * P, (h + 1) * P), P = pair_lanes(head_dim), holding K in its first head_dim lanes and V
in the next head_dim, zeros after. The minor dim is a multiple of 128 and the second-minor one is block_size, so
the row-major layout is also the compact one and the kernels read the cache in place.

Costs: head_dim 64 wastes nothing (a pair is one 128-lane row) and 128 / 256 nothing either; 96 takes 256 lanes for
192 (1.33x, what padding head_dim to 128 costs too), 32 takes 128 for 64 (2x). The attention kernel reads a head's
whole pair window: for a head_dim that is not a multiple of 128 the query is placed in the K lanes of a zero row of
P lanes, so q . window = q . k, and p @ window carries p @ v in the V lanes (tpu_attention.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vllm_jax.pallas_kernels.kv_quant import quantize

LANES = 128


def pair_lanes(head_dim: int) -> int:
    """Lanes one KV head's (K | V) pair takes in a cache row: 2 * head_dim rounded up to whole 128-lane tiles."""
    return -(-2 * head_dim // LANES) * LANES


def row_lanes(num_kv_heads: int, head_dim: int) -> int:
    """The lane-dense cache's minor dim."""
    return num_kv_heads * pair_lanes(head_dim)


def cache_kv_heads(kv_cache: jax.Array, head_dim: int) -> int:
    """KV heads of a lane-dense cache (any leading dims) whose heads are `head_dim` wide."""
    lanes, pair = kv_cache.shape[-1], pair_lanes(head_dim)
    if lanes % pair:
        raise ValueError(f"a lane-dense KV cache row of {lanes} lanes does not hold whole {pair}-lane pairs of "
                         f"head_dim {head_dim}")
    return lanes // pair


def interleave_rows(k: jax.Array, v: jax.Array, dtype, k_scale: float = 1.0, v_scale: float = 1.0) -> jax.Array:
    """[T, H, D] K and V -> [T, H * pair_lanes(D)] lane-dense cache rows (k_h | v_h | zeros per head), quantized
    for a `dtype` cache (kv_quant.quantize, the bytes every backend writes)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    pair = jnp.concatenate([quantize(k, dtype, k_scale), quantize(v, dtype, v_scale)], axis=-1)
    pad = pair_lanes(head_dim) - 2 * head_dim
    if pad:
        pair = jnp.pad(pair, ((0, 0), (0, 0), (0, pad)))
    return pair.reshape(num_tokens, num_kv_heads * pair_lanes(head_dim))


def split_rows(rows: jax.Array, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """Inverse of interleave_rows for [..., lanes] rows -> K and V [..., H, head_dim] (tests, debugging)."""
    heads = cache_kv_heads(rows, head_dim)
    pairs = rows.reshape(*rows.shape[:-1], heads, pair_lanes(head_dim))
    return pairs[..., :head_dim], pairs[..., head_dim:2 * head_dim]


def from_interleaved(kv_cache: jax.Array) -> jax.Array:
    """The other backends' [..., 2 * H, D] cache (k0, v0, k1, v1, ...) as lane-dense rows [..., H * P] (tests)."""
    *lead, combined, head_dim = kv_cache.shape
    pairs = kv_cache.reshape(*lead, combined // 2, 2 * head_dim)  # row h: k_h then v_h
    pad = pair_lanes(head_dim) - 2 * head_dim
    if pad:
        pairs = jnp.pad(pairs, [(0, 0)] * (len(lead) + 1) + [(0, pad)])
    return pairs.reshape(*lead, combined // 2 * pair_lanes(head_dim))


def to_interleaved(rows: jax.Array, head_dim: int) -> jax.Array:
    """Inverse of from_interleaved (the padding lanes dropped): [..., H * P] -> [..., 2 * H, head_dim] (tests)."""
    k, v = split_rows(rows, head_dim)
    return jnp.stack([k, v], axis=-2).reshape(*rows.shape[:-1], 2 * k.shape[-2], head_dim)

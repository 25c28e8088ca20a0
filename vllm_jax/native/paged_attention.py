"""Ragged paged attention for a few query rows on CPU, by the native kernel in paged_attention.cc: one pass over
each row's keys in the cache, where the `xla` backend gathers pages, transposes K and V and merges an in-step and
a context part (docs/architecture/07-attention.md, "Attention kernels"). `attention/xla.py` calls it for CPU programs
(`jax.lax.platform_dependent`: a GPU or TPU program keeps the XLA ops)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.native import build

TARGET = "vllm_jax_paged_attention"
# Steps of at most this many tokens take the kernel (decode, small chunks): it scores each row against its keys
# one by one, where XLA's in-step part of a long prefill is a real matmul.
MAX_ROWS = 64


def available() -> bool:
    """Whether the kernel is built and registered with XLA (once per process)."""
    return build.registered("paged_attention.cc", ((TARGET, "VllmJaxPagedAttention"),))


def applies(q: jax.Array, kv_cache: jax.Array, shared_kv: bool = False) -> bool:
    """float32 q [T <= MAX_ROWS, Hq, D] over a float32 K/V-interleaved cache (not MLA's shared rows)."""
    return (not shared_kv and q.ndim == 3 and q.shape[0] <= MAX_ROWS and q.dtype == jnp.float32
            and kv_cache.dtype == jnp.float32 and kv_cache.ndim in (4, 5) and available())


def paged_attention(q: jax.Array, kv_cache: jax.Array, layer_index: jax.Array | int, block_tables: jax.Array,
                    seq_lens: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array, window: jax.Array,
                    sinks: jax.Array | None, *, sm_scale: float, soft_cap: float | None,
                    v_scale: float) -> jax.Array:
    """[T, Hq, D] float32: AttentionBackend.attention's contract (k_scale already folded into `sm_scale`); `window`
    0 for none, `soft_cap` None or <= 0 for none."""
    if kv_cache.ndim == 4:
        kv_cache, layer_index = kv_cache[None], 0
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential")
    return call(q, kv_cache, _scalar(layer_index), block_tables.astype(jnp.int32), seq_lens.astype(jnp.int32),
                query_start_loc.astype(jnp.int32), _scalar(num_seqs), _scalar(window),
                jnp.zeros((1,), jnp.float32) if sinks is None else sinks.astype(jnp.float32),
                sm_scale=np.float32(sm_scale), soft_cap=np.float32(soft_cap or 0.0), v_scale=np.float32(v_scale),
                has_sinks=sinks is not None)


def _scalar(value: jax.Array | int) -> jax.Array:
    return jnp.reshape(jnp.asarray(value, jnp.int32), (1,))

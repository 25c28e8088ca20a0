"""The Pallas kernels under tensor parallelism: attention and the KV write inside `shard_map` over the KV heads.

GSPMD cannot split a Pallas call ("Mosaic kernels cannot be automatically partitioned"), so each device runs
the kernel on its own heads (sharding/rules.kv_head_layout picks the layout):

* tp divides the KV heads ("sharded"): the cache is split on its heads (whole (k_i, v_i) pairs per device, as
  sharding/rules.kv_cache_partition_spec lays it out; pallas_tpu's lane-dense cache on its row of whole pair
  windows: the backend's `cache_head_spec`), q on its head axis; device i's query heads are exactly those of
  its KV heads, so each device runs the unchanged kernel on its slice.
* tp is a multiple of the KV heads ("replicated": more devices than KV heads): the cache is replicated (every
  device holds every KV head, the rules' fallback) and q is split; device i's query heads all use KV head
  i // (tp / kv_heads), which the kernel reads from the replicated pages (`kv_head_offset`). The KV write runs
  on every device with the replicated k/v, so every copy of the cache gets every head.
* anything else (e.g. 6 KV heads on 4 devices) is refused with a ValueError naming --tensor-parallel-size.

The block table, lengths and slots are replicated. AttentionBackend._on calls these with `call`, the backend's
one-device kernel (scales and static arguments bound), when its mesh splits the kernels over tp > 1 devices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from vllm_jax.sharding.mesh import MODEL_AXIS
from vllm_jax.sharding.rules import kv_head_layout

AXIS = MODEL_AXIS
HEADS = P(None, AXIS, None)  # q, k, v and the output: [T, heads, head_dim] split on the heads


class CacheLayout(Protocol):
    """What these wrappers ask of the backend (attention/base.py's AttentionBackend): where its cache keeps the
    heads. A protocol, so that this module needs nothing from base.py, which calls it."""

    def cache_kv_heads(self, kv_cache: jax.Array, head_dim: int) -> int: ...

    def cache_head_spec(self, ndim: int, axis: str) -> P: ...


def _int32(x):
    """A traced scalar argument (None stays None, static)."""
    return None if x is None else jnp.asarray(x, jnp.int32)


def attention(backend: CacheLayout, mesh: Mesh, tp: int, call: Callable, q: jax.Array, kv_cache: jax.Array,
              block_tables: jax.Array, seq_lens: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array, *,
              sliding_window, layer_index, sinks) -> jax.Array:
    """Ragged paged attention per device (see the module docstring); the result's head axis is split like q's,
    and so are the `sinks` ([num_q_heads]: each device gets its own heads' sinks)."""
    num_kv_heads = backend.cache_kv_heads(kv_cache, q.shape[-1])
    layout = kv_head_layout(num_kv_heads, tp, q.shape[1])
    cache_spec = backend.cache_head_spec(kv_cache.ndim, AXIS) if layout == "sharded" else P()

    def local(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, window, layer, *local_sinks):
        offset = None
        if layout == "replicated":
            offset = jax.lax.axis_index(AXIS) // (tp // num_kv_heads)
        return call(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, sliding_window=window,
                    layer_index=layer, kv_head_offset=offset, sinks=local_sinks[0] if local_sinks else None)

    extra, extra_specs = ((sinks,), (P(AXIS),)) if sinks is not None else ((), ())
    return jax.shard_map(local, mesh=mesh, in_specs=(HEADS, cache_spec, P(), P(), P(), P(), P(), P(), *extra_specs),
                         out_specs=HEADS, check_vma=False)(
        q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, _int32(sliding_window), _int32(layer_index),
        *extra)


def mla_attention(backend: CacheLayout, mesh: Mesh, tp: int, call: Callable, q_latent: jax.Array,
                  q_rope: jax.Array, kv_cache: jax.Array, block_tables: jax.Array, seq_lens: jax.Array,
                  query_start_loc: jax.Array, num_seqs: jax.Array, *, layer_index) -> jax.Array:
    """MLA per device: its one latent row per token is shared by every head, so the cache is replicated (each
    device holds all of it) and each device runs the kernel on its own query heads; the result's head axis is
    split like q's."""
    if q_latent.shape[1] % tp:
        raise ValueError(f"--tensor-parallel-size ({tp}) must divide the number of query heads "
                         f"({q_latent.shape[1]})")

    def local(q_latent, q_rope, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, layer):
        return call(q_latent, q_rope, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, layer_index=layer)

    return jax.shard_map(local, mesh=mesh, in_specs=(HEADS, HEADS, P(), P(), P(), P(), P(), P()),
                         out_specs=HEADS, check_vma=False)(
        q_latent, q_rope, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, _int32(layer_index))


def write_kv_cache(backend: CacheLayout, mesh: Mesh, tp: int, call: Callable, kv_cache: jax.Array,
                   k: jax.Array, v: jax.Array, slot_mapping: jax.Array, *, layer_index) -> jax.Array:
    """The KV write per device: each writes its KV heads into its cache shard, or, with a replicated cache, every
    head into its copy. The cache keeps its sharding (in place when donated)."""
    sharded = kv_head_layout(k.shape[1], tp) == "sharded"
    cache_spec, kv_spec = (backend.cache_head_spec(kv_cache.ndim, AXIS), HEADS) if sharded else (P(), P())

    def local(kv_cache, k, v, slot_mapping, layer):
        return call(kv_cache, k, v, slot_mapping, layer_index=layer)

    return jax.shard_map(local, mesh=mesh, in_specs=(cache_spec, kv_spec, kv_spec, P(), P()), out_specs=cache_spec,
                         check_vma=False)(kv_cache, k, v, slot_mapping, _int32(layer_index))

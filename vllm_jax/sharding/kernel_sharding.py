"""The Pallas kernels under tensor parallelism: attention and the KV write inside `shard_map` over the KV heads.

GSPMD cannot split a Pallas call ("Mosaic kernels cannot be automatically partitioned"), so each device runs
the kernel on its own heads:

* tp divides the KV heads: the cache is split on its interleaved head axis (whole (k_i, v_i) pairs per device,
  as sharding/rules.kv_cache_partition_spec lays it out; pallas_tpu's lane-dense cache on its row of whole pair
  windows, pallas_kernels/kv_layout.py), q on its head axis; device i's query heads are
  exactly those of its KV heads, so each device runs the unchanged kernel on its slice.
* tp is a multiple of the KV heads (more devices than KV heads): the cache is replicated (every device holds
  every KV head, rules' fallback) and q is split; device i's query heads all use KV head i // (tp / kv_heads),
  which the kernel reads from the replicated pages (`kv_head_offset`). The KV write runs on every device with
  the replicated k/v, so every copy of the cache gets every head.
* anything else (e.g. 6 KV heads on 4 devices) is refused with a ValueError naming --tensor-parallel-size.

The block table, lengths and slots are replicated. With the `xla` backend nothing is wrapped: GSPMD
partitions plain XLA ops itself. The model calls these with its mesh in place of
pallas_kernels.ragged_paged_attention / write_kv_cache (same arguments after the mesh).
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from vllm_jax.pallas_kernels import dispatch
from vllm_jax.pallas_kernels.kv_layout import cache_kv_heads, uses_lane_dense
from vllm_jax.sharding.mesh import MODEL_AXIS


def kv_head_layout(num_kv_heads: int, tp: int, num_q_heads: int | None = None) -> str:
    """"sharded" (tp divides the KV heads) or "replicated" (tp is a multiple of them); else a ValueError."""
    if num_q_heads is not None and num_q_heads % tp:
        raise ValueError(f"--tensor-parallel-size ({tp}) must divide the number of query heads ({num_q_heads})")
    if num_kv_heads % tp == 0:
        return "sharded"
    if tp % num_kv_heads == 0:
        return "replicated"
    raise ValueError(f"--tensor-parallel-size ({tp}) must divide the number of KV heads ({num_kv_heads}) or be a "
                     f"multiple of it for the Pallas kernels; use a tp that does, or --attention-backend xla")


def _head_spec(ndim: int, axis: str) -> P:
    """Split the second-to-last (head) axis of a [..., heads, head_dim] array."""
    return P(*([None] * (ndim - 2)), axis, None)


def _cache_spec(kv_cache: jax.Array, backend: str, axis: str) -> P:
    """The sharded cache's spec: the head axis, or the lane-dense row's last axis (whole pair windows)."""
    if uses_lane_dense(backend):
        return P(*([None] * (kv_cache.ndim - 1)), axis)
    return _head_spec(kv_cache.ndim, axis)


def _tp(mesh: Mesh, axis: str) -> int:
    return dict(zip(mesh.axis_names, mesh.devices.shape))[axis]


def sharded_ragged_paged_attention(mesh: Mesh, q: jax.Array, kv_cache: jax.Array, block_tables: jax.Array,
                                   seq_lens: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array, *,
                                   sm_scale: float, sliding_window: int | jax.Array | None = None,
                                   soft_cap: float | None = None, layer_index: jax.Array | int | None = None,
                                   backend: str = "auto", interpret=False, platform: str | None = None,
                                   axis: str = MODEL_AXIS, k_scale: float = 1.0, v_scale: float = 1.0,
                                   sinks: jax.Array | None = None) -> jax.Array:
    """dispatch.ragged_paged_attention over `mesh`'s `axis` (see the module docstring); the result's head axis
    is split like q's, and so are the `sinks` ([num_q_heads]: each device gets its own heads' sinks)."""
    backend = dispatch.resolve_backend(backend, platform)
    call = functools.partial(dispatch.ragged_paged_attention, sm_scale=sm_scale, soft_cap=soft_cap, backend=backend,
                             interpret=interpret, platform=platform, k_scale=k_scale, v_scale=v_scale)
    tp = _tp(mesh, axis)
    if backend == "xla" or tp == 1:
        return call(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, sliding_window=sliding_window,
                    layer_index=layer_index, sinks=sinks)
    num_kv_heads = (cache_kv_heads(kv_cache, q.shape[-1]) if uses_lane_dense(backend) else
                    kv_cache.shape[-2] // 2)
    layout = kv_head_layout(num_kv_heads, tp, q.shape[1])
    window = None if sliding_window is None else jax.numpy.asarray(sliding_window, jax.numpy.int32)
    layer = None if layer_index is None else jax.numpy.asarray(layer_index, jax.numpy.int32)
    cache_spec = _cache_spec(kv_cache, backend, axis) if layout == "sharded" else P()

    def local(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, window, layer, *local_sinks):
        offset = None
        if layout == "replicated":
            offset = jax.lax.axis_index(axis) // (tp // num_kv_heads)
        return call(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, sliding_window=window,
                    layer_index=layer, kv_head_offset=offset, sinks=local_sinks[0] if local_sinks else None)

    q_spec = P(None, axis, None)
    extra, extra_specs = ((sinks,), (P(axis),)) if sinks is not None else ((), ())
    return jax.shard_map(local, mesh=mesh, in_specs=(q_spec, cache_spec, P(), P(), P(), P(), P(), P(), *extra_specs),
                         out_specs=q_spec, check_vma=False)(
        q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, window, layer, *extra)


def sharded_mla_attention(mesh: Mesh, q_latent: jax.Array, q_rope: jax.Array, kv_cache: jax.Array,
                          block_tables: jax.Array, seq_lens: jax.Array, query_start_loc: jax.Array,
                          num_seqs: jax.Array, *, sm_scale: float, layer_index: jax.Array | int | None = None,
                          backend: str = "auto", interpret=False, platform: str | None = None,
                          axis: str = MODEL_AXIS, kv_scale: float = 1.0) -> jax.Array:
    """dispatch.mla_ragged_paged_attention over `mesh`'s `axis`: MLA's one latent row per token is shared by every
    head, so the cache is replicated (each device holds all of it) and each device runs the kernel on its own
    query heads; the result's head axis is split like q's. The xla backend is left to GSPMD."""
    backend = dispatch.resolve_backend(backend, platform)
    call = functools.partial(dispatch.mla_ragged_paged_attention, sm_scale=sm_scale, backend=backend,
                             interpret=interpret, platform=platform, kv_scale=kv_scale)
    tp = _tp(mesh, axis)
    if backend == "xla" or tp == 1:
        return call(q_latent, q_rope, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs,
                    layer_index=layer_index)
    if q_latent.shape[1] % tp:
        raise ValueError(f"--tensor-parallel-size ({tp}) must divide the number of query heads "
                         f"({q_latent.shape[1]})")
    layer = None if layer_index is None else jax.numpy.asarray(layer_index, jax.numpy.int32)

    def local(q_latent, q_rope, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, layer):
        return call(q_latent, q_rope, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, layer_index=layer)

    q_spec = P(None, axis, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(q_spec, q_spec, P(), P(), P(), P(), P(), P()),
                         out_specs=q_spec, check_vma=False)(
        q_latent, q_rope, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, layer)


def sharded_write_kv_cache(mesh: Mesh, kv_cache: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array, *,
                           layer_index: jax.Array | int | None = None, backend: str = "auto", interpret=False,
                           platform: str | None = None, axis: str = MODEL_AXIS, k_scale: float = 1.0,
                           v_scale: float = 1.0) -> jax.Array:
    """dispatch.write_kv_cache over `mesh`'s `axis`: each device writes its KV heads into its cache shard, or,
    with a replicated cache, every head into its copy. The cache keeps its sharding (in place when donated)."""
    backend = dispatch.resolve_backend(backend, platform)
    call = functools.partial(dispatch.write_kv_cache, backend=backend, interpret=interpret, platform=platform,
                             k_scale=k_scale, v_scale=v_scale)
    tp = _tp(mesh, axis)
    if backend == "xla" or tp == 1:
        return call(kv_cache, k, v, slot_mapping, layer_index=layer_index)
    num_kv_heads = k.shape[1]
    layout = kv_head_layout(num_kv_heads, tp)
    cache_spec, kv_spec = ((_cache_spec(kv_cache, backend, axis), P(None, axis, None)) if layout == "sharded"
                           else (P(), P()))
    layer = None if layer_index is None else jax.numpy.asarray(layer_index, jax.numpy.int32)

    def local(kv_cache, k, v, slot_mapping, layer):
        return call(kv_cache, k, v, slot_mapping, layer_index=layer)

    return jax.shard_map(local, mesh=mesh, in_specs=(cache_spec, kv_spec, kv_spec, P(), P()), out_specs=cache_spec,
                         check_vma=False)(kv_cache, k, v, slot_mapping, layer)

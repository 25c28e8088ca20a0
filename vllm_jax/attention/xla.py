"""The xla backend: plain XLA ops (the CPU default, and the fallback on any chip). Its cache interleaves K/V on the
head axis, and under tensor parallelism GSPMD partitions its ops itself (no shard_map). On one CPU device a step of
at most 64 tokens over a float32 cache runs the native kernel instead (native/paged_attention.py)."""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax.sharding import Mesh

from vllm_jax.attention.base import AttentionBackend
from vllm_jax.native import paged_attention
from vllm_jax.pallas_kernels import mla_attention, xla_attention, xla_common


@dataclasses.dataclass(frozen=True)
class XlaBackend(AttentionBackend):
    name = "xla"
    shard_mapped = False
    native_cpu: bool = True  # whether a CPU program may take the native kernel (off under a mesh: see attention)

    def _write_kv_cache(self, kv_cache, k, v, slot_mapping, *, layer_index, k_scale, v_scale) -> jax.Array:
        return xla_common.write_kv_cache(kv_cache, k, v, slot_mapping, layer_index=layer_index, k_scale=k_scale,
                                         v_scale=v_scale)

    def attention(self, *args, mesh: Mesh | None = None, **kwargs) -> jax.Array:
        """AttentionBackend.attention; under a mesh GSPMD partitions the XLA ops, where it would gather the sharded
        cache around a custom call, so the native kernel is off there."""
        backend = self if mesh is None else dataclasses.replace(self, native_cpu=False)
        return super(XlaBackend, backend).attention(*args, mesh=mesh, **kwargs)

    def _attention(self, q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, *, sm_scale,
                   sliding_window, soft_cap, layer_index, k_scale, v_scale, sinks,
                   kv_head_offset=None) -> jax.Array:
        xla = functools.partial(_xla_attention, sm_scale=sm_scale, soft_cap=soft_cap, k_scale=k_scale,
                                v_scale=v_scale)
        args = (q, kv_cache, layer_index, block_tables, seq_lens, query_start_loc, num_seqs,
                xla_common.window_value(sliding_window), sinks)
        if not (self.native_cpu and paged_attention.applies(q, kv_cache)):
            return xla(*args)
        native = functools.partial(_native_attention, sm_scale=sm_scale * k_scale, soft_cap=soft_cap,
                                   v_scale=v_scale)
        return jax.lax.platform_dependent(*args, default=xla, cpu=native)

    def _mla_attention(self, q_latent, q_rope, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, *,
                       sm_scale, layer_index, kv_scale) -> jax.Array:
        return mla_attention.mla_ragged_paged_attention(q_latent, q_rope, kv_cache, block_tables, seq_lens,
                                                        query_start_loc, num_seqs, sm_scale=sm_scale,
                                                        layer_index=layer_index, kv_scale=kv_scale)


def _xla_attention(q, kv_cache, layer_index, block_tables, seq_lens, query_start_loc, num_seqs, window, sinks, *,
                   sm_scale, soft_cap, k_scale, v_scale) -> jax.Array:
    return xla_attention.ragged_paged_attention(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs,
                                                sm_scale=sm_scale, sliding_window=window, soft_cap=soft_cap,
                                                layer_index=layer_index, k_scale=k_scale, v_scale=v_scale,
                                                sinks=sinks)


def _native_attention(q, kv_cache, layer_index, block_tables, seq_lens, query_start_loc, num_seqs, window, sinks, *,
                      sm_scale, soft_cap, v_scale) -> jax.Array:
    out = paged_attention.paged_attention(q, kv_cache, layer_index, block_tables, seq_lens, query_start_loc,
                                          num_seqs, window, sinks, sm_scale=sm_scale, soft_cap=soft_cap,
                                          v_scale=v_scale)
    return out.astype(q.dtype)

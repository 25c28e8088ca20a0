"""The xla backend: plain XLA ops (the CPU default, and the fallback on any chip). Its cache interleaves K/V on the
head axis, and under tensor parallelism GSPMD partitions its ops itself (no shard_map)."""

from __future__ import annotations

import jax

from vllm_jax.attention.base import AttentionBackend
from vllm_jax.pallas_kernels import mla_attention, xla_attention, xla_common


class XlaBackend(AttentionBackend):
    name = "xla"
    shard_mapped = False

    def _write_kv_cache(self, kv_cache, k, v, slot_mapping, *, layer_index, k_scale, v_scale) -> jax.Array:
        return xla_common.write_kv_cache(kv_cache, k, v, slot_mapping, layer_index=layer_index, k_scale=k_scale,
                                         v_scale=v_scale)

    def _attention(self, q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, *, sm_scale,
                   sliding_window, soft_cap, layer_index, k_scale, v_scale, sinks,
                   kv_head_offset=None) -> jax.Array:
        return xla_attention.ragged_paged_attention(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs,
                                                    sm_scale=sm_scale, sliding_window=sliding_window,
                                                    soft_cap=soft_cap, layer_index=layer_index, k_scale=k_scale,
                                                    v_scale=v_scale, sinks=sinks)

    def _mla_attention(self, q_latent, q_rope, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, *,
                       sm_scale, layer_index, kv_scale) -> jax.Array:
        return mla_attention.mla_ragged_paged_attention(q_latent, q_rope, kv_cache, block_tables, seq_lens,
                                                        query_start_loc, num_seqs, sm_scale=sm_scale,
                                                        layer_index=layer_index, kv_scale=kv_scale)

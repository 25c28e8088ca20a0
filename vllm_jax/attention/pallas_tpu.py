"""The pallas_tpu backend: the Mosaic kernels over the lane-dense KV cache (pallas_kernels/kv_layout.py: one row of
kv_heads * pair_lanes(head_dim) lanes per token, which the kernels read in place), whose block table is a multiple
of 128 wide on a TPU; inside shard_map under tensor parallelism; on CPU in Pallas interpret mode."""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from vllm_jax.attention.pallas import PallasBackend
from vllm_jax.pallas_kernels import kv_layout, kv_write, tpu_attention, tpu_mla_attention
from vllm_jax.pallas_kernels.tpu_plan import LANES, round_up


class PallasTpuBackend(PallasBackend):
    name = "pallas_tpu"
    write_kernel = staticmethod(kv_write.write_kv_cache_tpu)
    attention_kernel = staticmethod(tpu_attention.ragged_paged_attention_tpu)
    lane_dense = True

    def cache_kv_heads(self, kv_cache: jax.Array, head_dim: int) -> int:
        return kv_layout.cache_kv_heads(kv_cache, head_dim)

    def cache_head_spec(self, ndim: int, axis: str) -> P:
        """Split the lane-dense row: its shards hold whole pair windows."""
        return P(*([None] * (ndim - 1)), axis)

    def block_table_width(self, blocks_per_seq: int) -> int:
        """The Mosaic kernel copies 128-aligned windows of a table row, so on a TPU its table is a multiple of 128
        wide (a narrower one would be padded at every layer call); interpret mode takes the plain width."""
        return round_up(blocks_per_seq, LANES) if self.platform == "tpu" else blocks_per_seq

    def kernel_names(self, mla: bool) -> tuple[str, ...]:
        # the KV write into the lane-dense cache (and MLA's latent row) is an XLA scatter (kv_write.py)
        return ("vllm_jax_mla_attention",) if mla else ("vllm_jax_ragged_paged_attention",)

    def _interpret_mode(self):
        mode = super()._interpret_mode()
        return self.interpret if mode and self.interpret not in (False, True) else mode  # pltpu.InterpretParams

    def _mla_kernel(self, q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, *, kv_lora_rank,
                    qk_rope_head_dim, sm_scale, layer_index, interpret, kv_scale) -> jax.Array:
        return tpu_mla_attention.mla_attention_tpu(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs,
                                                   kv_lora_rank=kv_lora_rank, sm_scale=sm_scale,
                                                   layer_index=layer_index, interpret=interpret, kv_scale=kv_scale)

"""The pallas_gpu backend: the Triton kernels (attention, the KV write, MLA) over the interleaved K/V cache, inside
shard_map under tensor parallelism; on CPU in Pallas interpret mode."""

from __future__ import annotations

import jax

from vllm_jax.attention.pallas import PallasBackend
from vllm_jax.pallas_kernels import gpu_attention, gpu_mla_attention, kv_write


class PallasGpuBackend(PallasBackend):
    name = "pallas_gpu"
    write_kernel = staticmethod(kv_write.write_kv_cache_gpu)
    attention_kernel = staticmethod(gpu_attention.ragged_paged_attention_gpu)

    def kernel_names(self, mla: bool) -> tuple[str, ...]:
        if mla:
            return ("vllm_jax_mla_attention",)  # the latent row is written by an XLA scatter
        return ("vllm_jax_ragged_paged_attention", "vllm_jax_write_kv_cache")

    def _mla_kernel(self, q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, *, kv_lora_rank,
                    qk_rope_head_dim, sm_scale, layer_index, interpret, kv_scale) -> jax.Array:
        return gpu_mla_attention.mla_attention_gpu(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs,
                                                   kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
                                                   sm_scale=sm_scale, layer_index=layer_index, interpret=interpret,
                                                   kv_scale=kv_scale)

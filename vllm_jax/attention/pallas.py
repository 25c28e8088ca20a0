"""What the two Pallas backends share: interpret mode off their chip, the calls into their KV write and attention
kernels (which take the same arguments on both chips), and the MLA query their kernels read."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import ClassVar

import jax

from vllm_jax.attention.base import AttentionBackend
from vllm_jax.pallas_kernels import mla_attention


class PallasBackend(AttentionBackend):
    # the chip's kernels on one device's arrays (kv_write.write_kv_cache_*, *_attention.ragged_paged_attention_*)
    write_kernel: ClassVar[Callable[..., jax.Array]]
    attention_kernel: ClassVar[Callable[..., jax.Array]]

    def _interpret_mode(self):
        """What the kernels get as `interpret=`: False on their own chip, interpret mode on CPU (or when asked).

        TPU kernels on CPU use the generic interpreter with the Mosaic-path loads, which runs inside the scanned,
        jitted model step; tests also run them under pltpu.InterpretParams (PallasTpuBackend passes those on)."""
        return bool(self.interpret) or self.platform == "cpu"

    def _write_kv_cache(self, kv_cache, k, v, slot_mapping, **kwargs) -> jax.Array:
        return self.write_kernel(kv_cache, k, v, slot_mapping, interpret=self._interpret_mode(), **kwargs)

    def _attention(self, q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, **kwargs) -> jax.Array:
        return self.attention_kernel(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs,
                                     interpret=self._interpret_mode(), **kwargs)

    def _mla_attention(self, q_latent, q_rope, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, *,
                       sm_scale, layer_index, kv_scale) -> jax.Array:
        rank = q_latent.shape[-1]
        mla_attention.check_row(kv_cache, rank, q_rope.shape[-1])
        q = mla_attention.mla_query(q_latent, q_rope, kv_cache.shape[-1])
        return self._mla_kernel(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, kv_lora_rank=rank,
                                qk_rope_head_dim=q_rope.shape[-1], sm_scale=sm_scale, layer_index=layer_index,
                                interpret=self._interpret_mode(), kv_scale=kv_scale)

    @abstractmethod
    def _mla_kernel(self, q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, *, kv_lora_rank,
                    qk_rope_head_dim, sm_scale, layer_index, interpret, kv_scale) -> jax.Array:
        """The MLA kernel on q [T, H, width] = [q_latent | q_rope | zeros]."""

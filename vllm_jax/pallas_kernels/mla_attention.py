"""Multi-head latent attention (DeepSeek-V2/V3 MLA) over the paged latent cache, absorbed form, in plain XLA.

The cache holds one row per token and layer: [c_kv (kv_lora_rank), k_rope (qk_rope_head_dim)], the normed latent
and the rotated shared key part, then zeros up to a multiple of 128 lanes ([num_layers, num_blocks, block_size, 1,
width]; docs/architecture/04-kv-cache.md, "KV cache layout"). With W_UK / W_UV the key / value halves of kv_b_proj, head
h's score against token s is q_nope_h . (W_UK_h c_s) + q_rope_h . k_rope_s = (W_UK_h^T q_nope_h) . c_s + q_rope_h .
k_rope_s, so the caller absorbs q_nope into latent space (q_latent) and the attention is MQA with one shared key row
[c_s, k_rope_s] of width kv_lora_rank + qk_rope_head_dim whose value is c_s: the output stays in latent space
and the caller applies W_UV. That is xla_attention.ragged_paged_attention with `shared_kv` (the row is key and
value; its rope tail is dropped from the output), so ragged batches, chunked prefill reading earlier pages and
decode take the same paths as every other model.

This is the `xla` backend's MLA (GSPMD partitions it under tensor parallelism: heads split, latent cache
replicated); the Pallas backends run their own kernels (tpu_mla_attention.py, gpu_mla_attention.py) with the same
contract, chosen by the backend object (vllm_jax/attention/). Every backend writes the row here (write_mla_cache: one
XLA scatter, in place in the donated cache).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vllm_jax.pallas_kernels import xla_attention
from vllm_jax.pallas_kernels.kv_quant import quantize
from vllm_jax.pallas_kernels.xla_common import scatter_slots


def write_mla_cache(kv_cache: jax.Array, latent: jax.Array, k_rope: jax.Array, slot_mapping: jax.Array,
                    layer_index: jax.Array | int | None = None, kv_scale: float = 1.0) -> jax.Array:
    """Scatter this step's rows [latent (kv_lora_rank) | k_rope (qk_rope_head_dim)] ([T, .] each) into their
    slots, as xla_common.write_kv_cache does for K/V; padding tokens write into the null block 0. A cache row
    wider than the two (lane padding) gets zeros after them. An fp8 cache gets the row saturated like every other
    write (kv_quant.quantize: row / kv_scale, 1.0 by default)."""
    row = jnp.concatenate([latent, k_rope.astype(latent.dtype)], axis=-1)
    row = jnp.pad(row, ((0, 0), (0, kv_cache.shape[-1] - row.shape[-1])))
    row = quantize(row[:, None, :], kv_cache.dtype, kv_scale)  # [T, 1, width]
    return scatter_slots(kv_cache, row, slot_mapping, layer_index)


def mla_query(q_latent: jax.Array, q_rope: jax.Array, width: int) -> jax.Array:
    """[q_latent | q_rope | zeros] ([T, H, width]): the query every backend scores against the cache row; the
    zeros meet the row's lane padding."""
    q = jnp.concatenate([q_latent, q_rope.astype(q_latent.dtype)], axis=-1)
    return jnp.pad(q, ((0, 0), (0, 0), (0, width - q.shape[-1])))


def mla_ragged_paged_attention(q_latent: jax.Array, q_rope: jax.Array, kv_cache: jax.Array, block_tables: jax.Array,
                               seq_lens: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array, *,
                               sm_scale: float, layer_index: jax.Array | int | None = None,
                               kv_scale: float = 1.0) -> jax.Array:
    """Causal ragged MLA over the paged latent cache -> [T, num_heads, kv_lora_rank] in latent space (float32
    softmax, result in q_latent's dtype). q_latent [T, H, kv_lora_rank] (q_nope absorbed through W_UK), q_rope
    [T, H, qk_rope_head_dim] (rotated); `kv_cache` one layer [blocks, block_size, 1, width] or the whole stack
    with `layer_index`; the batch arguments as xla_attention.ragged_paged_attention's. `kv_scale`: the cache holds
    row / kv_scale (kv_quant: folded into the score scale and the output)."""
    rank = q_latent.shape[-1]
    check_row(kv_cache, rank, q_rope.shape[-1])
    q = mla_query(q_latent, q_rope, kv_cache.shape[-1])
    out = xla_attention.ragged_paged_attention(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs,
                                               sm_scale=sm_scale, layer_index=layer_index, shared_kv=True,
                                               k_scale=kv_scale, v_scale=kv_scale)
    return out[..., :rank]


def check_row(kv_cache: jax.Array, rank: int, rope: int) -> None:
    """The cache's rows must be one [kv_lora_rank + qk_rope_head_dim (+ padding)] row per token."""
    if kv_cache.shape[-2] != 1 or kv_cache.shape[-1] < rank + rope:
        raise ValueError(f"MLA cache rows must be [1, at least kv_lora_rank + qk_rope_head_dim = {rank} + "
                         f"{rope}]; got {tuple(kv_cache.shape[-2:])}")

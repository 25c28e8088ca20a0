"""Static pl.CostEstimates of the kernels, so XLA's cost analysis (and vllm_jax.aot's roofline) counts them.

The sequence lengths are known only at run time, so attention is estimated for the bucket at full
occupancy: every sequence slot holds min(max_model_len, cache size / slots) tokens of context. That is the
bucket's upper bound, not the step's cost.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl


def attention_cost(*, num_tokens: int, num_seqs: int, num_q_heads: int, cache_kv_heads: int, head_dim: int,
                   block_size: int, table_width: int, num_pages: int, q_dtype, kv_dtype, tile_tokens: int,
                   extra_bytes: int = 0) -> pl.CostEstimate:
    """One attention call at full occupancy. Flops: QK^T and PV (2 x 2 x head_dim per query head and key);
    transcendentals: one exp per query head and key; bytes: the queries and the output once, each sequence's
    pages once per query tile of it (all `cache_kv_heads` of a page move), its table entries, `extra_bytes`."""
    context = max(1, min(table_width * block_size, num_pages * block_size // max(num_seqs, 1)))
    tokens_per_seq = -(-num_tokens // max(num_seqs, 1))
    tiles_per_seq = max(1, -(-tokens_per_seq // max(tile_tokens, 1)))
    page_reads = num_seqs * tiles_per_seq * -(-context // block_size)
    kv_bytes = page_reads * block_size * 2 * cache_kv_heads * head_dim * jnp.dtype(kv_dtype).itemsize
    q_bytes = 2 * num_tokens * num_q_heads * head_dim * jnp.dtype(q_dtype).itemsize
    keys = num_tokens * context
    return pl.CostEstimate(flops=int(4 * keys * num_q_heads * head_dim), transcendentals=int(keys * num_q_heads),
                           bytes_accessed=int(kv_bytes + q_bytes + 4 * page_reads + extra_bytes))


def kv_write_cost(*, num_tokens: int, combined: int, head_dim: int, dtype) -> pl.CostEstimate:
    """The KV write moves each new [2H, head_dim] row twice (read, then written into its page)."""
    row = combined * head_dim * jnp.dtype(dtype).itemsize
    return pl.CostEstimate(flops=0, transcendentals=0, bytes_accessed=int(2 * num_tokens * row + 4 * num_tokens))

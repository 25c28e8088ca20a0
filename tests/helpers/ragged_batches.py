"""Random ragged batches over a paged KV cache with shuffled pages, for the kernel tests: padding rows after the
real ones, padding sequence slots after the live ones, block 0 (the null block) never used by a sequence."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

NUM_KV_HEADS = 2


def _lengths(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(query lengths, context lengths) of a random ragged batch of the given kind."""
    if kind == "decode":
        return np.ones(6, np.int64), rng.integers(0, 45, 6)
    if kind == "prefill":
        return rng.integers(1, 24, 3), np.zeros(3, np.int64)
    q = np.concatenate([rng.integers(2, 22, 2), [1, 1, 1], rng.integers(2, 22, 1)])
    ctx = np.concatenate([[0], rng.integers(1, 30, 5)])  # the chunk after a context starts mid-page
    return q, ctx


def paged_batch(q_lens: np.ndarray, seq_lens: np.ndarray, *, rng: np.random.Generator, block_size: int,
                num_kv_heads: int, q_heads: int, head_dim: int, dtype: Any, layers: int | None,
                extra_columns: int = 1, pad_rows: int = 5, pad_seqs: int = 2) -> tuple:
    """(q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, real_rows) for the given lengths."""
    n, total = len(q_lens), int(q_lens.sum())
    pages_needed = -(-seq_lens // block_size)
    num_blocks = int(pages_needed.sum()) + 4
    width = int(pages_needed.max()) + extra_columns
    pages = rng.permutation(np.arange(1, num_blocks))  # block 0 is the null block
    tables = np.zeros((n + pad_seqs, width), np.int32)
    used = 0
    for s in range(n):
        tables[s, :pages_needed[s]] = pages[used:used + pages_needed[s]]
        used += pages_needed[s]
    qsl = np.full(n + pad_seqs + 1, total, np.int32)
    qsl[0], qsl[1:n + 1] = 0, np.cumsum(q_lens)
    lens = np.zeros(n + pad_seqs, np.int32)
    lens[:n] = seq_lens
    shape = (num_blocks, block_size, 2 * num_kv_heads, head_dim)
    kv = rng.standard_normal(((layers,) if layers else ()) + shape)
    q = rng.standard_normal((total + pad_rows, q_heads, head_dim))
    return (jnp.asarray(q, dtype), jnp.asarray(kv, dtype), jnp.asarray(tables), jnp.asarray(lens),
            jnp.asarray(qsl), jnp.asarray([n], jnp.int32), total)


def make_batch(kind: str, *, group: int, head_dim: int, dtype: Any, block_size: int, layers: int | None,
               seed: int, num_kv_heads: int = NUM_KV_HEADS) -> tuple:
    """A "decode", "prefill" or "mixed" batch (query chunks that start and end inside pages); see paged_batch."""
    rng = np.random.default_rng(seed)
    q_lens, ctx = _lengths(kind, rng)
    return paged_batch(q_lens, q_lens + ctx, rng=rng, block_size=block_size, num_kv_heads=num_kv_heads,
                       q_heads=num_kv_heads * group, head_dim=head_dim, dtype=dtype, layers=layers)


def long_batch(seed: int, dtype: Any, block_size: int) -> tuple:
    """Four long decode rows and a 7-row chunk over 2 layers, lengths reaching past 128 table columns at
    block_size 4 (the table is 5 columns wider than the longest sequence needs)."""
    rng = np.random.default_rng(seed)
    q_lens = np.array([1, 1, 1, 7, 1])
    seq_lens = np.array([rng.integers(520, 600), 1300, rng.integers(100, 200), rng.integers(900, 1000), 3])
    return paged_batch(q_lens, seq_lens, rng=rng, block_size=block_size, num_kv_heads=NUM_KV_HEADS,
                       q_heads=2 * NUM_KV_HEADS, head_dim=64, dtype=dtype, layers=2, extra_columns=5, pad_rows=3,
                       pad_seqs=1)

"""Rows of a table by index (the embedding lookup, the hidden states of the rows that get logits), in a TPU program as
a loop over 32-row chunks.

XLA:TPU emits a gather of N rows as N row copies written out one after the other: its compile grows with N, to
1.3-1.7 s of CPU at 256 rows, two of a forward's largest kernels after the matmuls (the embedding lookup and the
logits rows, in every forward of a 256-sequence bucket), where a loop over 32-row chunks compiles its one body in
~0.15 s and runs N / 32 iterations of the same copies (docs/accelerators.md, "Ahead-of-time compile checks", its
"Gathers in a loop"). Other platforms, and forwards traced over a mesh (a vocab-parallel table's gather is
partitioned with an all-reduce, which a loop would repeat per chunk), keep the one gather.
"""

from __future__ import annotations

import jax

CHUNK_ROWS = 32


def take_rows(table: jax.Array, indices: jax.Array, *, sharded: bool = False) -> jax.Array:
    """table[indices] for 1-D `indices`: the same rows on every platform."""
    n = indices.shape[0]
    if sharded or n <= CHUNK_ROWS or n % CHUNK_ROWS:
        return table[indices]
    return jax.lax.platform_dependent(table, indices, default=_whole, tpu=rows_by_chunks)


def _whole(table: jax.Array, indices: jax.Array) -> jax.Array:
    return table[indices]


def rows_by_chunks(table: jax.Array, indices: jax.Array) -> jax.Array:
    """table[indices] as a loop over CHUNK_ROWS indices at a time (len(indices) a multiple of it)."""
    rows = jax.lax.map(lambda chunk: table[chunk], indices.reshape(-1, CHUNK_ROWS))
    return rows.reshape(indices.shape[0], *table.shape[1:])

"""Matmuls against quantized weights that are not plain x @ W: kept GGUF blocks (rebuilt inside the dot), the
weight-only / W8A8 dot of int8 / fp8 values, grouped scales' per-group partial sums, and a table's rows (the tied
LM head, quantized or, on CPU, float) in vocab-row chunks. `layers.linear` picks among them
(docs/architecture/06-model.md, "Quantized weights")."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from vllm_jax.model.grouped_quant import dequantize_grouped


def gguf_dot(x: jax.Array, values: jax.Array, scale: jax.Array, minimum: jax.Array | None,
             fmt: str) -> jax.Array:
    """x @ W for W kept in GGUF blocks: dequantized to float32 (exactly the dequantizing loader's weight), cast
    to x's dtype and dotted in one fusion; weight-only on every platform
    (docs/architecture/06-model.md, "Quantized weights": on CPU faster than W8A8 over groups, whose int8 dot is batched
    over 32-wide groups)."""
    w = dequantize_grouped(values, scale, minimum, fmt, axis=-2).astype(x.dtype)
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


_NARROW_WEIGHTS = (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn))


def dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """x @ w: int8 activations (W8A8) accumulate in int32; a quantized weight under float activations is
    converted to their dtype inside the dot (weight-only); everything else accumulates in float32."""
    if x.dtype == jnp.int8:
        return jnp.dot(x, w, preferred_element_type=jnp.int32)
    if w.dtype in _NARROW_WEIGHTS:
        w = w.astype(x.dtype)
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


def _over_row_chunks(dot_rows: Callable[..., jax.Array], tables: tuple, chunk_rows: int | None) -> jax.Array:
    """float32 [T, V]: `dot_rows(*tables)` ([T, rows] logits of a table's rows; parts [V, ...] or None) over
    the whole table, or with `chunk_rows` (CPU) over chunks of rows through a loop: XLA:CPU writes a converted /
    dequantized operand out before its dot, and a chunk's (1024 x 576 float32 on the default model) stays in
    cache where the whole table's (113 MB) does not."""
    v = tables[0].shape[0]
    chunk_rows = _dividing_chunk(v, chunk_rows) if chunk_rows else None
    if chunk_rows is None:
        return dot_rows(*tables)
    n = v // chunk_rows
    chunks = tuple(None if a is None else a.reshape(n, chunk_rows, *a.shape[1:]) for a in tables)
    out = jax.lax.map(lambda parts: dot_rows(*parts), chunks)  # [n, T, chunk_rows]
    return out.transpose(1, 0, 2).reshape(out.shape[1], v)


def _dividing_chunk(v: int, target: int) -> int | None:
    """The largest divisor of `v` rows at most `target` and above target / 4 (a chunk loop needs equal chunks), or
    None when there is none or it would be the whole table."""
    for rows in range(min(target, v - 1), target // 4, -1):
        if v % rows == 0:
            return rows
    return None


def dot_rows(x: jax.Array, table: jax.Array, chunk_rows: int | None) -> jax.Array:
    """float32 x @ E^T for a float table E [V, H] (the tied LM head), in row chunks on CPU (`_over_row_chunks`:
    XLA:CPU's dot over the whole transposed table streamed it at a fifth of the layers' GB/s; docs/performance.md,
    "Batch-1 decode profile": 2.3-2.8x faster at 2-32 rows, bit-identical logits)."""
    def dot_chunk(e: jax.Array) -> jax.Array:
        return jnp.dot(x, e.T, preferred_element_type=jnp.float32)

    return _over_row_chunks(dot_chunk, (table,), chunk_rows)


def gguf_dot_rows(x: jax.Array, values: jax.Array, scale: jax.Array, minimum: jax.Array | None, fmt: str,
                  chunk_rows: int | None) -> jax.Array:
    """float32 x @ E^T for a table E [V, H] kept in GGUF blocks grouped along H (the tied LM head), in row chunks
    on CPU (`_over_row_chunks`; measured 17 ms vs 124 ms for the default model's head at 2 rows, float32 105 ms)."""
    def dot_rows(v: jax.Array, s: jax.Array, m: jax.Array | None) -> jax.Array:
        table = dequantize_grouped(v, s, m, fmt, axis=-1).astype(x.dtype)
        return jnp.dot(x, table.T, preferred_element_type=jnp.float32)

    return _over_row_chunks(dot_rows, (values, scale, minimum), chunk_rows)


def quantized_dot_rows(x: jax.Array, values: jax.Array, scale: jax.Array, chunk_rows: int | None) -> jax.Array:
    """float32 x @ E^T for a table E [V, H] quantized per row (int8 / fp8 values, float32 scales [V, 1]: online
    quantization's tied LM head), weight-only: the values converted to x's dtype inside the dot, each logit
    scaled by its row's scale; in row chunks on CPU (`_over_row_chunks`;
    docs/architecture/06-model.md, "Quantized weights": the default model's int8 head 6.5 ms at 2 rows chunked, 54 ms
    whole, W8A8 70 ms; float32 8.7 ms)."""
    def dot_rows(v: jax.Array, s: jax.Array) -> jax.Array:
        return jnp.dot(x, v.astype(x.dtype).T, preferred_element_type=jnp.float32) * s[:, 0]

    return _over_row_chunks(dot_rows, (values, scale), chunk_rows)


def grouped_dot(x: jax.Array, w: jax.Array, groups: int) -> jax.Array:
    """float32 [..., groups, out]: each run of in // groups input rows' share of x @ w (weight-only: the values
    converted to x's dtype inside the dot), for grouped scales to weight before the sum."""
    rows = w.shape[0] // groups
    xg = x.reshape(*x.shape[:-1], groups, rows)
    wg = w.astype(x.dtype).reshape(groups, rows, w.shape[1])
    return jnp.einsum("...gk,gko->...go", xg, wg, preferred_element_type=jnp.float32)

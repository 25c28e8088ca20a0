"""Matmuls against quantized weights that are not plain x @ W: kept GGUF blocks (rebuilt inside the dot), the
weight-only / W8A8 dot of int8 / fp8 values, grouped scales' per-group partial sums, and a table's rows (the tied
LM head, quantized or, on CPU, float) in vocab-row chunks, and on CPU float weights against a few rows by a native
kernel. The weight forms (model/weight_forms) call them, each its own
(docs/architecture/06-model.md, "Weight forms" and "Quantized weights")."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.model.grouped_quant import dequantize_grouped
from vllm_jax.native import float_head, float_matvec, gguf_matvec


def gguf_dot(x: jax.Array, values: jax.Array, scale: jax.Array, minimum: jax.Array | None,
             fmt: str) -> jax.Array:
    """float32 x @ W for W kept in GGUF blocks, weight-only on every platform (docs/architecture/06-model.md,
    "Quantized weights"): `gguf_dots` of one weight."""
    return gguf_dots(x, [(values, scale, minimum, fmt)])[0]


def gguf_dots(x: jax.Array, weights: Sequence[tuple]) -> list[jax.Array]:
    """float32 x @ W for each W kept in GGUF blocks, (values, scale, minimum or None, fmt). A CPU program with at
    most `gguf_matvec.MAX_ROWS` float32 rows reads the blocks directly in the native kernel (native/gguf_matvec.py),
    all the weights in one call, when it is built; otherwise, and on accelerators, each W is dequantized to float32
    (exactly the dequantizing loader's weight), cast to x's dtype and dotted in one fusion."""
    fmts = [fmt for *_, fmt in weights]
    parts = [tuple(w[:3]) for w in weights]

    def dequantized(x, _, parts):
        return [jnp.dot(x, dequantize_grouped(*p, fmt, axis=-2).astype(x.dtype), preferred_element_type=jnp.float32)
                for p, fmt in zip(parts, fmts)]

    def native(x, valid, parts):
        return gguf_matvec.gguf_matvec(x, valid, [(*p, fmt) for p, fmt in zip(parts, fmts)])

    if not all(gguf_matvec.applies(x, p[0], fmt, gguf_matvec.MAX_ROWS) for p, fmt in zip(parts, fmts)):
        return dequantized(x, None, parts)
    return jax.lax.platform_dependent(x, gguf_matvec.valid_rows(x.shape[0]), parts, default=dequantized, cpu=native)


_NARROW_WEIGHTS = (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn))


def dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """x @ w: int8 activations (W8A8) accumulate in int32; a quantized weight under float activations is
    converted to their dtype inside the dot (weight-only); everything else accumulates in float32."""
    if x.dtype == jnp.int8:
        return jnp.dot(x, w, preferred_element_type=jnp.int32)
    if w.dtype in _NARROW_WEIGHTS:
        w = w.astype(x.dtype)
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


def float_dots(x: jax.Array, weights: Sequence[jax.Array]) -> list[jax.Array]:
    """`dot(x, w)` for each weight; float32 x and weights [in, out] in a CPU program with at most
    `float_matvec.MAX_ROWS` rows of x as one call of the native kernel (native/float_matvec.py), which streams the
    weights at close to the machine's read bandwidth where XLA:CPU's dot reaches about half of it (the default
    model's 30 layers at 1 row: 24 -> 13-15 ms, docs/performance.md, "Batch-1 decode profile")."""
    def xla(x, _, *weights):
        return [dot(x, w) for w in weights]

    if not float_matvec.applies(x, weights):
        return xla(x, None, *weights)
    return jax.lax.platform_dependent(x, gguf_matvec.valid_rows(x.shape[0]), *weights, default=xla,
                                      cpu=float_matvec.float_matvec)


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
    """float32 x @ E^T for a float table E [V, H] (the tied LM head), whole or in row chunks (`_over_row_chunks`;
    on CPU where `float_head_chunk_rows` finds the chunks faster), bit-identical logits either way."""
    def dot_chunk(e: jax.Array) -> jax.Array:
        return jnp.dot(x, e.T, preferred_element_type=jnp.float32)

    return _over_row_chunks(dot_chunk, (table,), chunk_rows)


def float_dot_rows(x: jax.Array, table: jax.Array, chunk_rows: Callable[[], int | None]) -> jax.Array:
    """float32 x @ E^T for a float table E [V, H] (the tied LM head): in a CPU program with at most
    `float_head.MAX_ROWS` float32 rows by the native kernel (native/float_head.py), which reads the table in place
    (XLA:CPU's dot packs its whole transpose on every call: the default model's head 6.2 -> 3.3 ms at 2 rows);
    otherwise `dot_rows`, with `chunk_rows()` (asked only then: it may time the table's two forms)."""
    if not float_head.applies(x, table):
        return dot_rows(x, table, chunk_rows())
    return jax.lax.platform_dependent(x, table, gguf_matvec.valid_rows(x.shape[0]),
                                      default=lambda x, t, _: dot_rows(x, t, None), cpu=float_head.float_rows_dot)


# The float head's probe table: at most this many bytes (past any cache, so it streams as the real table does).
_PROBE_TABLE_BYTES = 64 << 20


@functools.cache
def float_head_chunk_rows(vocab: int, hidden: int, dtype_name: str, chunk_rows: int) -> int | None:
    """CPU: `chunk_rows` when the float tied head's dot (`dot_rows`, bit-identical logits either way) is faster in
    row chunks on this machine, else None (the whole table in one dot). Which is faster depends on the CPU's
    instruction set: XLA:CPU's dot packed the whole transposed table first on an AVX2 EPYC (chunks 2.3x faster),
    and read it in place on an AVX-512 Xeon (whole 2x faster; docs/performance.md, "Batch-1 decode profile"). So
    it is timed once per process and table shape, at trace time, on a random table of the same width and up to
    64 MiB (a cost of ~0.3 s)."""
    with jax.ensure_compile_time_eval():  # called while a forward is traced: run, do not stage
        return _time_float_head(vocab, hidden, dtype_name, chunk_rows)


def _time_float_head(vocab: int, hidden: int, dtype_name: str, chunk_rows: int) -> int | None:
    dtype = jnp.dtype(dtype_name)
    rows = min(vocab, max(4 * chunk_rows, _PROBE_TABLE_BYTES // (hidden * dtype.itemsize)) // chunk_rows * chunk_rows)
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.standard_normal((rows, hidden), np.float32), dtype)
    x = jnp.asarray(rng.standard_normal((2, hidden), np.float32), dtype)
    variants = {chunk_rows: jax.jit(lambda x, t: dot_rows(x, t, chunk_rows)),
                None: jax.jit(lambda x, t: dot_rows(x, t, None))}
    best = dict.fromkeys(variants, float("inf"))
    for fn in variants.values():
        fn(x, table).block_until_ready()  # compile, and the first run's page faults
    for _ in range(5):  # alternated, so a burst of other work on the machine hits both
        for key, fn in variants.items():
            start = time.perf_counter()
            fn(x, table).block_until_ready()
            best[key] = min(best[key], time.perf_counter() - start)
    return chunk_rows if best[chunk_rows] < best[None] else None


def gguf_dot_rows(x: jax.Array, values: jax.Array, scale: jax.Array, minimum: jax.Array | None, fmt: str,
                  chunk_rows: int | None) -> jax.Array:
    """float32 x @ E^T for a table E [V, H] kept in GGUF blocks grouped along H (the tied LM head): on CPU with at
    most `gguf_matvec.TABLE_MAX_ROWS` float32 rows by the native kernel (native/gguf_matvec.py) when it is built;
    otherwise dequantized inside the dot, in row chunks on CPU (`_over_row_chunks`; measured 17 ms vs 124 ms for
    the default model's head at 2 rows, float32 105 ms)."""
    def dequantized(x, _, values, scale, minimum):
        def dot_rows(v: jax.Array, s: jax.Array, m: jax.Array | None) -> jax.Array:
            table = dequantize_grouped(v, s, m, fmt, axis=-1).astype(x.dtype)
            return jnp.dot(x, table.T, preferred_element_type=jnp.float32)

        return _over_row_chunks(dot_rows, (values, scale, minimum), chunk_rows)

    if not gguf_matvec.applies(x, values, fmt, gguf_matvec.TABLE_MAX_ROWS):
        return dequantized(x, None, values, scale, minimum)
    return jax.lax.platform_dependent(x, gguf_matvec.valid_rows(x.shape[0]), values, scale, minimum,
                                      default=dequantized, cpu=functools.partial(gguf_matvec.gguf_rows_dot, fmt=fmt))


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

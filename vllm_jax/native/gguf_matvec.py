"""x @ W (a linear weight) and x @ E^T (a table: the tied LM head) for a few rows of x against weights kept in GGUF
blocks, on CPU, by the native kernels in gguf_matvec.cc: they read the 4- and 8-bit blocks directly, where XLA:CPU
writes a float copy of each matrix before its dot (docs/architecture/06-model.md, "Quantized weights").
`quantized_dots.gguf_dot` / `gguf_dot_rows` call them in CPU programs (`jax.lax.platform_dependent`: an
accelerator program built on a CPU host keeps the XLA path)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.native import build

TARGETS = {"matvec": "VllmJaxGgufMatvec", "rows_dot": "VllmJaxGgufRowsDot"}  # ours -> the library's symbol
FORMAT_CODES = {"q8_0": 0, "q4_0": 1, "q4_1": 2, "q4_k": 3, "q6_k": 4}  # gguf_matvec.cc's `Format`
# Above this many rows of x XLA's dot of the dequantized copy catches up (docs/performance.md, "Batch-1 decode
# profile"): a linear weight's, and a table's (whose chunked XLA dot keeps each dequantized chunk in cache).
MAX_ROWS = 64
TABLE_MAX_ROWS = 8


def available() -> bool:
    """Whether the kernels are built and registered with XLA (once per process)."""
    return build.registered("gguf_matvec.cc", tuple((_target(name), symbol) for name, symbol in TARGETS.items()))


def _target(name: str) -> str:
    return f"vllm_jax_gguf_{name}"


def applies(x: jax.Array, values: jax.Array, fmt: str, max_rows: int) -> bool:
    """Whether the kernels take this dot: float32 x [rows <= max_rows, in], one 2-d weight, a format they read."""
    return (x.ndim == 2 and values.ndim == 2 and x.dtype == jnp.float32 and x.shape[0] <= max_rows
            and fmt in FORMAT_CODES and traced_unsharded() and available())


KeptWeight = tuple  # (values, scale, minimum or None, fmt) of one weight kept in GGUF blocks


def gguf_matvec(x: jax.Array, valid: jax.Array, weights: Sequence[KeptWeight]) -> list[jax.Array]:
    """float32 [rows, out] for each weight: x [rows, in] @ W [in, out] kept as (values, scale[, minimum]) in fmt,
    grouped along `in` (model/grouped_quant.py's linear layout), for the first `valid` rows (int32 [1]:
    `valid_rows`, an operand so that a cached trace of a caller never holds another trace's value); the rest are
    zeros. Several weights (q / k / v, gate / up) are one call, their column tiles shared out together."""
    outs = [jax.ShapeDtypeStruct((x.shape[0], values.shape[1]), jnp.float32) for values, *_ in weights]
    call = jax.ffi.ffi_call(_target("matvec"), outs, vmap_method="sequential")
    buffers = [b for values, scale, minimum, _ in weights
               for b in (values, scale, scale if minimum is None else minimum)]  # a format without mins: unread
    fmts = np.array([FORMAT_CODES[fmt] for *_, fmt in weights], np.int32)
    return list(call(x, valid, *buffers, fmts=fmts))


def gguf_rows_dot(x: jax.Array, valid: jax.Array, values: jax.Array, scale: jax.Array, minimum: jax.Array | None,
                  fmt: str) -> jax.Array:
    """float32 [rows, vocab]: x [rows, hidden] @ E^T for a table E [vocab, hidden] kept in `fmt`, grouped along
    hidden (model/grouped_quant.py's embedding layout), for the first `valid` rows (as `gguf_matvec`)."""
    out = jax.ShapeDtypeStruct((x.shape[0], values.shape[0]), jnp.float32)
    call = jax.ffi.ffi_call(_target("rows_dot"), out, vmap_method="sequential")
    return call(x, valid, values, scale, scale if minimum is None else minimum, fmt=np.int32(FORMAT_CODES[fmt]))


_traced = threading.local()  # .padding: [(bucket rows, valid rows, sharded)] of the forwards this thread is tracing


@contextlib.contextmanager
def padded_rows(bucket_rows: int, valid: jax.Array, *, sharded: bool = False) -> Iterator[None]:
    """While a forward is traced: its activations have `bucket_rows` rows of which the first `valid` (a
    traced int32 scalar) are real and the rest the bucket's padding, which the kernels then skip (their outputs are
    zeros; nothing reads them). A batch-1 decode step on CPU runs in the 2-token bucket, so this halves its rows.
    `sharded`: the forward runs over a mesh (tensor parallelism), where the native kernels are not called (GSPMD
    would gather each sharded weight around the call)."""
    stack = _padding()
    stack.append((bucket_rows, jnp.reshape(valid, (1,)).astype(jnp.int32), sharded))
    try:
        yield
    finally:
        stack.pop()


def _padding() -> list[tuple[int, jax.Array, bool]]:
    """This thread's stack (warm-up traces forwards on several threads at once)."""
    if not hasattr(_traced, "padding"):
        _traced.padding = []
    return _traced.padding


def valid_rows(rows: int) -> jax.Array:
    """int32 [1]: how many of an operand's `rows` are real, as the innermost `padded_rows` of this many rows says
    (all of them otherwise)."""
    stack = _padding()
    if stack and stack[-1][0] == rows:
        return stack[-1][1]
    return jnp.full((1,), rows, jnp.int32)


def traced_unsharded() -> bool:
    """False inside a forward traced over a mesh (`padded_rows(..., sharded=True)`): the native kernels' `applies`
    then leaves the XLA dots to GSPMD."""
    stack = _padding()
    return not (stack and stack[-1][2])

"""x @ E^T for a few rows of x against a float32 table (a float model's tied LM head) on CPU, by the native kernel
in float_head.cc: it reads each table row in place, where XLA:CPU's dot first packs the whole table's transpose on
every call (docs/architecture/06-model.md, "Quantized weights"). `quantized_dots.float_dot_rows` calls it in CPU
programs (`jax.lax.platform_dependent`: an accelerator program built on a CPU host keeps the XLA dot)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vllm_jax.native import build, gguf_matvec

TARGET = "vllm_jax_float_rows_dot"
# Above this many rows of x XLA's dot, packing included, is the faster one (a 32-row step is compute-bound).
MAX_ROWS = 8


def available() -> bool:
    """Whether the kernel is built and registered with XLA (once per process)."""
    return build.registered("float_head.cc", ((TARGET, "VllmJaxFloatRowsDot"),))


def applies(x: jax.Array, table: jax.Array) -> bool:
    """float32 x [rows <= MAX_ROWS, in] against a float32 table [vocab, in]."""
    return (x.ndim == 2 and table.ndim == 2 and x.shape[0] <= MAX_ROWS and x.shape[1] == table.shape[1]
            and x.dtype == jnp.float32 and table.dtype == jnp.float32 and gguf_matvec.traced_unsharded()
            and available())


def float_rows_dot(x: jax.Array, table: jax.Array, valid: jax.Array) -> jax.Array:
    """float32 [rows, vocab] = x @ table^T for the first `valid` rows (int32 [1]: `gguf_matvec.valid_rows`, an
    operand so that a cached trace of a caller never holds another trace's value); the rest are zeros."""
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((x.shape[0], table.shape[0]), jnp.float32),
                            vmap_method="sequential")
    return call(x, valid, table)

"""x @ W for a few rows of x against float32 linear weights W [in, out] on CPU, by the native kernel in
float_matvec.cc: it reads W as several sequential streams at once, where XLA:CPU's dot streamed a batch-1 decode
step's weights at about half the machine's read bandwidth (docs/architecture/06-model.md, "Quantized weights").
`quantized_dots.float_dots` calls it in CPU programs (`jax.lax.platform_dependent`: an accelerator program built on
a CPU host keeps the XLA dot)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from vllm_jax.native import build, gguf_matvec

TARGET = "vllm_jax_float_matvec"
# Above this many rows of x XLA's dot is the faster one (docs/performance.md, "Batch-1 decode profile").
MAX_ROWS = 8


def available() -> bool:
    """Whether the kernel is built and registered with XLA (once per process)."""
    return build.registered("float_matvec.cc", ((TARGET, "VllmJaxFloatMatvec"),))


def applies(x: jax.Array, weights: Sequence[jax.Array]) -> bool:
    """float32 x [rows <= MAX_ROWS, in] against float32 weights [in, out]."""
    return (x.ndim == 2 and x.shape[0] <= MAX_ROWS and x.dtype == jnp.float32 and len(weights) > 0
            and all(w.ndim == 2 and w.shape[0] == x.shape[1] and w.dtype == jnp.float32 for w in weights)
            and gguf_matvec.traced_unsharded() and available())


def float_matvec(x: jax.Array, valid: jax.Array, *weights: jax.Array) -> list[jax.Array]:
    """float32 [rows, out] for each W: x @ W for the first `valid` rows (int32 [1]: `gguf_matvec.valid_rows`, an
    operand so that a cached trace of a caller never holds another trace's value); the rest are zeros."""
    outs = [jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.float32) for w in weights]
    call = jax.ffi.ffi_call(TARGET, outs, vmap_method="sequential")
    return list(call(x, valid, *weights))

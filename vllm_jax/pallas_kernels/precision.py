"""float32 means float32 on every chip: the matmul precision of a float32 model's programs.

jax's default precision for a float32 dot is the chip's fastest: TF32 on NVIDIA GPUs (10-bit mantissa) and one
bfloat16 pass on TPUs. PyTorch (and so transformers and vLLM on GPU) multiplies float32 in full float32 unless told
otherwise, so a `--dtype float32` engine here traces its programs under "highest" precision (measured on an H200:
the xla attention backend at default precision was 6-65x off a 2e-5 tolerance on float32 inputs;
docs/accelerators.md, "On an NVIDIA H200"). bfloat16 / float16 models keep the default: their dots' inputs are
already at that precision.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp


def float32_matmuls(dtype) -> contextlib.AbstractContextManager:
    """A context for tracing: "highest" matmul precision when `dtype` is float32, else nothing changes."""
    if jnp.dtype(dtype) == jnp.float32:
        return jax.default_matmul_precision("highest")
    return contextlib.nullcontext()


def at_query_precision(attention):
    """An attention function whose float32 query makes its dots float32 too, whoever calls it: the xla backend
    upcasts pages and queries to float32 inside, so only the query's own dtype says what the caller asked for."""
    @functools.wraps(attention)
    def traced(q, *args, **kwargs):
        with float32_matmuls(q.dtype):
            return attention(q, *args, **kwargs)
    return traced


def model_matmuls(state) -> contextlib.AbstractContextManager:
    """The tracing context of a model program whose params are `state`: float32_matmuls of its compute dtype."""
    return float32_matmuls(compute_dtype(state))


def compute_dtype(state) -> jnp.dtype:
    """A model's compute dtype read off its params: the dtype of its largest floating-point array (kept-quantized
    weights are integers; their scales and the norms are small)."""
    floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
    return max(floats, key=lambda x: x.size).dtype if floats else jnp.dtype(jnp.float32)

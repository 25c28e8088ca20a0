"""The gated delta rule's decode step (one token per sequence row) as a Pallas kernel, for TPU (Mosaic) and GPU
(Triton); the JAX form it must equal is vllm_jax/model/ssm/gated_delta.py's `decode_step`, and
`recurrent_gated_delta_rule(..., step=functools.partial(gated_delta_decode, platform=...))` runs a decode step
through it. Not wired into the engine yet.

Why a kernel: a decode step reads and writes every row's whole [Hv, dk, dv] float32 state for a few hundred
flops per state entry's column, so it is bound by the state's bytes; the kernel streams each state block through
once and writes the new one over the old (`input_output_aliases`), where XLA may keep the decayed, updated and
read states as separate passes.

How the work is cut: every value column of a state evolves on its own (its prediction k . S[:, j], its delta and
its update touch only column j), so the grid is (row, value head, value-column block): a program holds one
[dk, block_v] slice of one head's state. TPU takes the whole dv per program (the lane dim of a block must be all
of it or a multiple of 128); GPU takes 32 columns (a 128 x 32 float32 slice sits in registers). The program's
math is elementwise products and reductions over dk (sublanes on TPU), no dot: q and k come in as [dk, 1] columns
and v, g, beta as [1, *] rows, so every block's last two dims are whole array dims, as Mosaic wants.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vllm_jax.pallas_kernels.gpu_attention import _CompilerParams as _TritonParams

GPU_BLOCK_V = 32


def _kernel(q_ref, k_ref, v_ref, g_ref, beta_ref, state_ref, out_ref, new_state_ref):
    q, k = q_ref[0, 0], k_ref[0, 0]  # [dk, 1]
    state = state_ref[0, 0] * jnp.exp(g_ref[0, 0])  # [dk, bv] times [1, 1]
    predicted = jnp.sum(k * state, axis=0, keepdims=True)  # [1, bv]
    state = state + k * ((v_ref[0, 0] - predicted) * beta_ref[0, 0])
    new_state_ref[0, 0] = state
    out_ref[0, 0] = jnp.sum(q * state, axis=0, keepdims=True)


def gated_delta_decode(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                       state: jax.Array, *, platform: str, interpret=False) -> tuple[jax.Array, jax.Array]:
    """`decode_step` as a kernel: q, k [S, Hv, dk] (normalised, repeated to the value heads), v [S, Hv, dv],
    g, beta [S, Hv], state [S, Hv, dk, dv], all float32 -> (o [S, Hv, dv], new state over the old one).
    `platform` ("tpu" or "gpu") picks the column block and the compiler's parameters."""
    rows, heads, dk, dv = state.shape
    block_v = dv if platform == "tpu" else min(dv, GPU_BLOCK_V)
    if platform not in ("tpu", "gpu") or dv % block_v:
        raise ValueError(f"gated_delta_decode: platform {platform!r} with dv {dv} (tpu, or gpu with dv a "
                         f"multiple of {GPU_BLOCK_V} or below it)")
    if platform == "gpu" and (dk & (dk - 1) or block_v & (block_v - 1)):
        raise ValueError(f"gated_delta_decode on gpu: dk {dk} and the column block {block_v} must be powers of two")
    column = pl.BlockSpec((1, 1, dk, 1), lambda s, h, j: (s, h, 0, 0))
    scalar = pl.BlockSpec((1, 1, 1, 1), lambda s, h, j: (s, h, 0, 0))
    row = pl.BlockSpec((1, 1, 1, block_v), lambda s, h, j: (s, h, 0, j))
    block = pl.BlockSpec((1, 1, dk, block_v), lambda s, h, j: (s, h, 0, j))
    f32 = jnp.float32
    out, new_state = pl.pallas_call(
        _kernel,
        grid=(rows, heads, dv // block_v),
        in_specs=[column, column, row, scalar, scalar, block],
        out_specs=[row, block],
        out_shape=[jax.ShapeDtypeStruct((rows, heads, 1, dv), f32), jax.ShapeDtypeStruct(state.shape, f32)],
        input_output_aliases={5: 1},
        compiler_params=_TritonParams(num_warps=4, num_stages=1) if platform == "gpu" else None,
        interpret=interpret,
        name="vllm_jax_gated_delta_decode",
    )(q.astype(f32)[..., None], k.astype(f32)[..., None], v.astype(f32)[:, :, None, :],
      g.astype(f32)[..., None, None], beta.astype(f32)[..., None, None], state.astype(f32))
    return out[:, :, 0], new_state

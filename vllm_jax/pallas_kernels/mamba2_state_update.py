"""Mamba2's one-token state update (the decode step of model/ssm/mamba2_ssd.py's recurrent form) as a Pallas
kernel, the state updated in place.

One program per (row, head): it reads the head's [P, N] state, decays it by exp(dt A), adds dt x B^T, and writes
it back over its input (`input_output_aliases`: under a donated state XLA does not copy the [S, H, P, N] states),
with y = state C + D x. The head's group (which B / C it reads) is picked by the index maps, so nothing is repeated
per head in memory. Every block's last two dims are whole array dims (TPU's tiling rule); x and y travel as
[P, 1] columns and dt, A, D as [1, 1], so no transpose happens inside the kernel. For Triton (GPU), P and N must
be powers of two. A row with no token this step is given dt = 0 and x = 0 by the caller: its state is left exactly
as it was. Not yet wired into the engine (the JAX form is what the mixer calls); its Triton lowering is checked on a
CPU host, its Mosaic (TPU) compile is not yet (that needs libtpu).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton


def _kernel(state_ref, x_ref, dt_ref, a_ref, b_ref, c_ref, d_ref, y_ref, new_state_ref):
    state = state_ref[...]  # [P, N]
    x = x_ref[...]  # [P, 1]
    dt = dt_ref[...]  # [1, 1]
    updated = state * jnp.exp(dt * a_ref[...]) + (dt * x) * b_ref[...]  # [P, N]
    new_state_ref[...] = updated
    y_ref[...] = jnp.sum(updated * c_ref[...], axis=-1, keepdims=True) + d_ref[...] * x


def mamba2_state_update(state: jax.Array, x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array,
                        D: jax.Array, *, platform: str = "tpu",
                        interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """state [S, H, P, N] float32, x [S, H, P], dt [S, H] (after bias, softplus and clamp; 0 for rows without a
    token), A / D [H], B / C [S, G, N] -> (y [S, H, P] in x's dtype, the updated state [S, H, P, N] float32).
    `platform` "tpu" (Mosaic) or "gpu" (Triton); `interpret` is passed to pallas_call (CPU tests)."""
    rows, heads, head_dim, d_state = state.shape
    per_group = heads // B.shape[1]
    f32 = jnp.float32
    columns = x.astype(f32).reshape(rows, heads, head_dim, 1)
    scalars = dt.astype(f32).reshape(rows, heads, 1, 1)
    per_head = (A.astype(f32).reshape(heads, 1, 1), D.astype(f32).reshape(heads, 1, 1))
    b, c = (m.astype(f32).reshape(rows, m.shape[1], 1, d_state) for m in (B, C))
    head_block = pl.BlockSpec((None, 1, 1), lambda s, h: (h, 0, 0))
    group_block = pl.BlockSpec((None, None, 1, d_state), lambda s, h: (s, h // per_group, 0, 0))
    state_block = pl.BlockSpec((None, None, head_dim, d_state), lambda s, h: (s, h, 0, 0))
    column_block = pl.BlockSpec((None, None, head_dim, 1), lambda s, h: (s, h, 0, 0))
    y, new_state = pl.pallas_call(
        _kernel,
        grid=(rows, heads),
        in_specs=[state_block, column_block, pl.BlockSpec((None, None, 1, 1), lambda s, h: (s, h, 0, 0)),
                  head_block, group_block, group_block, head_block],
        out_specs=[column_block, state_block],
        out_shape=[jax.ShapeDtypeStruct((rows, heads, head_dim, 1), f32),
                   jax.ShapeDtypeStruct(state.shape, f32)],
        input_output_aliases={0: 1},
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1) if platform == "gpu" else None,
        interpret=interpret,
        name="vllm_jax_mamba2_state_update",
    )(state.astype(f32), columns, scalars, per_head[0], b, c, per_head[1])
    return y.reshape(rows, heads, head_dim).astype(x.dtype), new_state

"""The Pallas one-token Mamba2 state update (vllm_jax/pallas_kernels/mamba2_state_update.py) in interpret mode
against the JAX recurrent form (vllm_jax/model/ssm/mamba2_ssd.py), tiny shapes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vllm_jax.model.ssm.mamba2_ssd import ssd_recurrent
from vllm_jax.pallas_kernels.mamba2_state_update import mamba2_state_update


@pytest.mark.parametrize("groups", [1, 2])
def test_kernel_equals_the_jax_recurrent_form(groups):
    rng = np.random.default_rng(groups)
    rows, heads, head_dim, d_state = 5, 4, 8, 16
    lens = [1, 0, 1, 1, 0]  # rows 1 and 4 have no token this step
    num_seqs = 4
    f32 = np.float32
    x = rng.normal(size=(rows, heads, head_dim)).astype(f32)
    dt = np.log1p(np.exp(rng.normal(size=(rows, heads)))).astype(f32)
    A = -np.exp(rng.uniform(-1, 1, size=heads)).astype(f32)
    B, C = (rng.normal(size=(rows, groups, d_state)).astype(f32) for _ in range(2))
    D = rng.normal(size=heads).astype(f32)
    state = rng.normal(size=(rows, heads, head_dim, d_state)).astype(f32)
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    want_y, want_state = ssd_recurrent(*(jnp.asarray(a) for a in (x, dt, A, B, C, D, state)), jnp.asarray(qsl),
                                       jnp.asarray([num_seqs], jnp.int32))
    # the kernel takes one row per sequence: row s's token, dt and x zero where the row has none
    token = np.minimum(qsl[:-1], rows - 1)
    live = (np.array(lens) == 1)[:, None]
    update = jax.jit(functools.partial(mamba2_state_update, interpret=True))
    y, new_state = update(jnp.asarray(state), jnp.asarray(np.where(live[..., None], x[token], 0)),
                          jnp.asarray(np.where(live, dt[token], 0)), jnp.asarray(A), jnp.asarray(B[token]),
                          jnp.asarray(C[token]), jnp.asarray(D))
    np.testing.assert_allclose(np.asarray(new_state), np.asarray(want_state), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(new_state)[[1, 4]], state[[1, 4]])
    live_rows = [s for s in range(rows) if lens[s] == 1]
    np.testing.assert_allclose(np.asarray(y)[live_rows], np.asarray(want_y)[token[live_rows]], rtol=1e-5,
                               atol=1e-5)


def test_gpu_kernel_lowers_to_triton_with_the_state_aliased():
    """Lowered for CUDA on this CPU host (no GPU needed): the Triton lowering accepts the blocks, and the state
    input is aliased to the state output."""
    rows, heads, head_dim, d_state, groups = 3, 4, 8, 16, 2
    shapes = [(rows, heads, head_dim, d_state), (rows, heads, head_dim), (rows, heads), (heads,),
              (rows, groups, d_state), (rows, groups, d_state), (heads,)]
    args = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
    update = jax.jit(functools.partial(mamba2_state_update, platform="gpu"), donate_argnums=0)
    text = update.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "xla.gpu.triton" in text
    assert "output_operand_alias<output_tuple_indices = [1], operand_index = 0" in text

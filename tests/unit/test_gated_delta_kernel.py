"""The gated delta decode kernel (vllm_jax/pallas_kernels/gated_delta_decode.py) against the JAX decode step it
replaces (vllm_jax/model/ssm/gated_delta.py), in interpret mode on CPU with tiny shapes; and its lowering to
Mosaic (TPU) and Triton (GPU) IR (the compile itself needs the chip)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vllm_jax.model.ssm.gated_delta import decode_step, recurrent_gated_delta_rule
from vllm_jax.pallas_kernels.gated_delta_decode import gated_delta_decode
from vllm_jax.pallas_kernels.tpu_attention import interpret_params

S, HK, HV, DK, DV = 3, 1, 2, 16, 64  # dv 64: two column blocks of the GPU kernel


def rows(seed: int = 0) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    return (jnp.asarray(unit(rng.normal(size=(S, HV, DK))) * DK ** -0.5, jnp.float32),
            jnp.asarray(unit(rng.normal(size=(S, HV, DK))), jnp.float32),
            jnp.asarray(rng.normal(size=(S, HV, DV)), jnp.float32),
            jnp.asarray(-rng.uniform(0.01, 1.0, size=(S, HV)), jnp.float32),
            jnp.asarray(rng.uniform(0.0, 1.0, size=(S, HV)), jnp.float32),
            jnp.asarray(rng.normal(size=(S, HV, DK, DV)), jnp.float32))


@pytest.mark.parametrize("platform,interpret", [("tpu", "tpu_interpreter"), ("tpu", True), ("gpu", True)])
def test_kernel_equals_the_jax_decode_step(platform, interpret):
    args = rows()
    want_out, want_state = decode_step(*args)
    mode = interpret_params() if interpret == "tpu_interpreter" else interpret
    kernel = jax.jit(functools.partial(gated_delta_decode, platform=platform, interpret=mode))
    out, state = kernel(*args)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(state), np.asarray(want_state), rtol=1e-5, atol=1e-5)


def test_ragged_decode_through_the_kernel():
    """A decode step's ragged rows (one with no token, a padding row, bucket padding) through the kernel equal the
    JAX recurrent form: outputs of the real tokens and every row's final state (untouched rows exactly)."""
    rng = np.random.default_rng(1)
    num_tokens, num_rows, lens = 5, 5, [1, 0, 1, 1]
    qsl = jnp.asarray([0, 1, 1, 2, 3, 3], jnp.int32)
    q, k = (jnp.asarray(rng.normal(size=(num_tokens, HK, DK)), jnp.float32) for _ in range(2))
    v = jnp.asarray(rng.normal(size=(num_tokens, HV, DV)), jnp.float32)
    g = jnp.asarray(-rng.uniform(0.01, 1.0, size=(num_tokens, HV)), jnp.float32)
    beta = jnp.asarray(rng.uniform(size=(num_tokens, HV)), jnp.float32)
    initial = jnp.asarray(rng.normal(size=(num_rows, HV, DK, DV)), jnp.float32)
    args = (q, k, v, g, beta, initial, qsl, jnp.asarray([len(lens)], jnp.int32))
    kernel = functools.partial(gated_delta_decode, platform="gpu", interpret=True)
    got_out, got_final = jax.jit(functools.partial(recurrent_gated_delta_rule, step=kernel))(*args)
    want_out, want_final = jax.jit(recurrent_gated_delta_rule)(*args)
    np.testing.assert_allclose(np.asarray(got_out)[:3], np.asarray(want_out)[:3], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_final), np.asarray(want_final), rtol=1e-5, atol=1e-5)
    for untouched in (1, 4):
        np.testing.assert_array_equal(np.asarray(got_final)[untouched], np.asarray(initial)[untouched])


@pytest.mark.parametrize("platform,lowering,marker", [("tpu", "tpu", "tpu_custom_call"),
                                                      ("gpu", "cuda", "triton")])
def test_kernel_lowers(platform, lowering, marker):
    """Qwen3.5's shapes (32 value heads, dk = dv = 128) lower to the chip's kernel IR."""
    shapes = [(8, 32, 128), (8, 32, 128), (8, 32, 128), (8, 32), (8, 32), (8, 32, 128, 128)]
    args = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
    fn = jax.jit(functools.partial(gated_delta_decode, platform=platform))
    text = fn.trace(*args).lower(lowering_platforms=(lowering,)).as_text()
    assert marker in text

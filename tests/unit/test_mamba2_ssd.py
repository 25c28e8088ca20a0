"""Mamba2's ragged SSD (vllm_jax/model/ssm/mamba2_ssd.py) against transformers' torch scans (Granite 4.0-H's
`mamba2_chunk_scan` for prefills, `mamba2_selective_state_update` for one token), one sequence at a time."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.granitemoehybrid.modeling_granitemoehybrid import (
    mamba2_chunk_scan,
    mamba2_selective_state_update,
)

from vllm_jax.model.ssm.mamba2_ssd import ssd, ssd_recurrent

HEADS, HEAD_DIM, D_STATE = 4, 3, 5


@functools.partial(jax.jit, static_argnames="chunk_size")
def _ssd(*args, chunk_size):
    return ssd(*args, chunk_size=chunk_size)


def _inputs(rng, num_tokens: int, num_rows: int, groups: int) -> dict[str, np.ndarray]:
    f32 = np.float32
    return {
        "x": rng.normal(size=(num_tokens, HEADS, HEAD_DIM)).astype(f32),
        "dt": np.log1p(np.exp(rng.normal(size=(num_tokens, HEADS)))).astype(f32),  # softplus: positive
        "A": -np.exp(rng.uniform(-1.0, 1.0, size=HEADS)).astype(f32),
        "B": rng.normal(size=(num_tokens, groups, D_STATE)).astype(f32),
        "C": rng.normal(size=(num_tokens, groups, D_STATE)).astype(f32),
        "D": rng.normal(size=HEADS).astype(f32),
        "initial": rng.normal(size=(num_rows, HEADS, HEAD_DIM, D_STATE)).astype(f32),
    }


def _layout(lens: list[int], num_seqs: int, num_tokens: int) -> tuple[np.ndarray, list[int]]:
    starts = np.concatenate([[0], np.cumsum(lens[:num_seqs])]).astype(int).tolist()
    qsl = np.array(starts + [starts[-1]] * (len(lens) - num_seqs), np.int32)
    assert starts[-1] <= num_tokens
    return qsl, starts


def _run(a: dict, qsl: np.ndarray, num_seqs: int, chunk_size: int) -> tuple[np.ndarray, np.ndarray]:
    y, final = _ssd(*(jnp.asarray(a[k]) for k in ("x", "dt", "A", "B", "C", "D", "initial")), jnp.asarray(qsl),
                    jnp.asarray([num_seqs], jnp.int32), chunk_size=chunk_size)
    return np.asarray(y), np.asarray(final)


def _torch_chunked(a: dict, start: int, stop: int, row: int, chunk_size: int) -> tuple[np.ndarray, np.ndarray]:
    t = {k: torch.tensor(a[k][start:stop][None]) for k in ("x", "dt", "B", "C")}
    y, final = mamba2_chunk_scan(t["x"], t["dt"], torch.tensor(a["A"]), t["B"], t["C"], chunk_size,
                                 D=torch.tensor(a["D"]), initial_states=torch.tensor(a["initial"][row][None]),
                                 return_final_states=True)
    return y[0].numpy(), final[0].numpy()


@pytest.mark.parametrize("groups", [1, 2])
def test_chunked_equals_transformers_per_sequence(groups):
    rng = np.random.default_rng(groups)
    chunk = 4
    lens = [5, 0, 1, 3, 4, 11, 2, 0]  # > chunk, empty, one, < chunk, = chunk, > 2 chunks, short; then padding
    num_seqs = 7
    num_tokens = sum(lens) + 5  # bucket padding tokens
    a = _inputs(rng, num_tokens, len(lens), groups)
    qsl, starts = _layout(lens, num_seqs, num_tokens)
    y, final = _run(a, qsl, num_seqs, chunk)
    assert np.isfinite(y).all() and np.isfinite(final).all()
    for s in range(num_seqs):
        if lens[s] == 0:  # a row with no tokens keeps its state
            np.testing.assert_array_equal(final[s], a["initial"][s])
            continue
        ref_y, ref_final = _torch_chunked(a, starts[s], starts[s + 1], s, chunk)
        np.testing.assert_allclose(y[starts[s]:starts[s + 1]], ref_y, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(final[s], ref_final, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(final[num_seqs:], a["initial"][num_seqs:])  # padding rows


def test_chunk_sizes_agree_and_a_split_sequence_equals_one_call():
    rng = np.random.default_rng(3)
    lens = [37, 1, 16, 0]
    a = _inputs(rng, 64, len(lens), groups=2)
    qsl, starts = _layout(lens, 3, 64)
    y4, final4 = _run(a, qsl, 3, 4)
    y16, final16 = _run(a, qsl, 3, 16)
    np.testing.assert_allclose(y4, y16, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(final4, final16, rtol=1e-4, atol=1e-4)
    # the first sequence in two calls (13 tokens, then 24 from its state), one row each
    first = {k: v for k, v in a.items() if k != "initial"}
    head = {**first, "initial": a["initial"][:1]}
    y_head, mid = _run(head, np.array([0, 13], np.int32), 1, 4)
    tail = {k: v[13:] for k, v in first.items() if k in ("x", "dt", "B", "C")}
    tail.update(A=a["A"], D=a["D"], initial=mid)
    y_tail, end = _run(tail, np.array([0, 24], np.int32), 1, 4)
    np.testing.assert_allclose(np.concatenate([y_head[:13], y_tail[:24]]), y4[:37], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(end[0], final4[0], rtol=1e-4, atol=1e-4)


def _per_channel(v: np.ndarray) -> torch.Tensor:
    """[..., H] -> [..., H, P]: the per-channel form transformers' state update takes."""
    return torch.tensor(v)[..., None].expand(*v.shape, HEAD_DIM)


@pytest.mark.parametrize("groups,bucket_padding", [(1, 0), (2, 3)])
def test_recurrent_equals_transformers_state_update(groups, bucket_padding):
    rng = np.random.default_rng(10 + groups)
    lens = [1, 1, 0, 1, 1, 0]  # decodes, a row with no token, then a padding row: the recurrent form
    num_seqs = 5
    a = _inputs(rng, len(lens) + bucket_padding, len(lens), groups)  # a token bucket of S or more
    qsl, starts = _layout(lens, num_seqs, len(lens))
    y, final = _run(a, qsl, num_seqs, 4)
    assert np.isfinite(y).all()
    live = [s for s in range(num_seqs) if lens[s] == 1]
    tokens = [starts[s] for s in live]
    state = torch.tensor(a["initial"][live])
    out = mamba2_selective_state_update(
        state, torch.tensor(a["x"][tokens]), _per_channel(a["dt"][tokens]),
        torch.tensor(a["A"])[:, None, None].expand(HEADS, HEAD_DIM, D_STATE),
        torch.tensor(a["B"][tokens]), torch.tensor(a["C"][tokens]), _per_channel(a["D"]))
    np.testing.assert_allclose(y[tokens], out.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(final[live], state.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(final[[2, 5]], a["initial"][[2, 5]])
    # the step took the recurrent form: it gives the same numbers
    y_rec, final_rec = jax.jit(ssd_recurrent)(*(jnp.asarray(a[k]) for k in ("x", "dt", "A", "B", "C", "D", "initial")),
                                              jnp.asarray(qsl), jnp.asarray([num_seqs], jnp.int32))
    np.testing.assert_array_equal(y[tokens], np.asarray(y_rec)[tokens])
    np.testing.assert_array_equal(final, np.asarray(final_rec))


def test_a_prefill_in_a_decode_sized_bucket_takes_the_chunked_form():
    rng = np.random.default_rng(7)
    lens = [3, 1, 0, 0]  # T == S == 4, but the first row is a prefill
    a = _inputs(rng, 4, 4, groups=1)
    qsl, starts = _layout(lens, 2, 4)
    y, final = _run(a, qsl, 2, 4)
    ref_y, ref_final = _torch_chunked(a, 0, 3, 0, 4)
    np.testing.assert_allclose(y[:3], ref_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(final[0], ref_final, rtol=1e-4, atol=1e-4)

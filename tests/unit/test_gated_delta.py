"""The ragged gated delta rule (vllm_jax/model/ssm/gated_delta.py) against transformers' torch forms of it
(Qwen3.5's torch_chunk_gated_delta_rule and torch_recurrent_gated_delta_rule), one sequence at a time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule

from vllm_jax.model.ssm.gated_delta import chunked_gated_delta_rule, gated_delta_rule, recurrent_gated_delta_rule

HK, HV, DK, DV = 2, 4, 8, 6  # two value heads per key head


def ragged_inputs(lens: list[int], num_seqs: int, extra_tokens: int, seed: int = 0) -> dict:
    """Random inputs for rows of `lens` new tokens (rows past num_seqs are padding), `extra_tokens` of bucket
    padding after the real ones."""
    rng = np.random.default_rng(seed)
    total = sum(lens[:num_seqs])
    num_tokens = total + extra_tokens
    starts = np.concatenate([[0], np.cumsum(lens[:num_seqs])]).tolist()
    return dict(
        q=rng.normal(size=(num_tokens, HK, DK)).astype(np.float32),
        k=rng.normal(size=(num_tokens, HK, DK)).astype(np.float32),
        v=rng.normal(size=(num_tokens, HV, DV)).astype(np.float32),
        g=-rng.uniform(0.01, 1.0, size=(num_tokens, HV)).astype(np.float32),
        beta=rng.uniform(0.0, 1.0, size=(num_tokens, HV)).astype(np.float32),
        initial=rng.normal(size=(len(lens), HV, DK, DV)).astype(np.float32),
        query_start_loc=np.array(starts + [total] * (len(lens) - num_seqs), np.int32),
        num_seqs=np.array([num_seqs], np.int32))


def run(fn, inputs: dict, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    """fn jitted (chunk_size static) on the inputs, as numpy."""
    jitted = jax.jit(fn, static_argnames=tuple(kwargs))
    out, final = jitted(**{name: jnp.asarray(x) for name, x in inputs.items()}, **kwargs)
    return np.asarray(out), np.asarray(final)


def reference(inputs: dict, s: int, recurrent: bool) -> tuple[np.ndarray, np.ndarray]:
    """transformers' output and final state for sequence row s alone."""
    qsl = inputs["query_start_loc"]
    rows = slice(qsl[s], qsl[s + 1])
    t = {name: torch.tensor(inputs[name][rows][None]) for name in ("q", "k", "v", "g", "beta")}
    fn = torch_recurrent_gated_delta_rule if recurrent else torch_chunk_gated_delta_rule
    out, final = fn(t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"],
                    initial_state=torch.tensor(inputs["initial"][s][None]), output_final_state=True,
                    use_qk_l2norm_in_kernel=True)
    return out[0].numpy(), final[0].numpy()


def check_against_transformers(inputs: dict, out: np.ndarray, final: np.ndarray, recurrent: bool) -> None:
    qsl, num_seqs = inputs["query_start_loc"], int(inputs["num_seqs"][0])
    for s in range(num_seqs):
        if qsl[s + 1] > qsl[s]:
            ref_out, ref_final = reference(inputs, s, recurrent)
            np.testing.assert_allclose(out[qsl[s]:qsl[s + 1]], ref_out, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(final[s], ref_final, rtol=1e-4, atol=1e-4)
        else:  # a row with no tokens keeps its state
            np.testing.assert_array_equal(final[s], inputs["initial"][s])
    for s in range(num_seqs, final.shape[0]):
        np.testing.assert_array_equal(final[s], inputs["initial"][s])
    assert np.isfinite(final).all()


@pytest.mark.parametrize("chunk_size", [8, 64])
def test_chunked_equals_transformers_per_sequence(chunk_size):
    # 0 tokens, 1, fewer than a chunk, exactly a chunk, more than two chunks (at chunk_size 8); a padding row
    lens = [0, 1, 5, 8, 19, 3, 4]
    inputs = ragged_inputs(lens, num_seqs=6, extra_tokens=5)
    out, final = run(chunked_gated_delta_rule, inputs, chunk_size=chunk_size)
    check_against_transformers(inputs, out, final, recurrent=False)


def test_recurrent_equals_transformers_per_sequence():
    lens = [1, 0, 1, 1, 1, 0]  # decodes, a row with no token, a padding row
    inputs = ragged_inputs(lens, num_seqs=5, extra_tokens=2)  # T == S == 6
    out, final = run(recurrent_gated_delta_rule, inputs)
    check_against_transformers(inputs, out, final, recurrent=True)
    chunked_out, chunked_final = run(chunked_gated_delta_rule, inputs, chunk_size=4)
    real = slice(0, int(inputs["query_start_loc"][5]))
    np.testing.assert_allclose(chunked_out[real], out[real], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(chunked_final, final, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lens", [[1, 1, 0, 1], [2, 1, 1, 0]], ids=["decodes", "mixed"])
def test_dispatch_when_tokens_equal_rows(lens):
    """T == S holds all-decode steps and mixed ones alike: each must get the right answer."""
    inputs = ragged_inputs(lens, num_seqs=4, extra_tokens=4 - sum(lens))
    out, final = run(gated_delta_rule, inputs)
    check_against_transformers(inputs, out, final, recurrent=True)


def test_chunk_sizes_agree_with_the_recurrence():
    lens = [13, 0, 30, 7]
    inputs = ragged_inputs(lens, num_seqs=4, extra_tokens=3, seed=1)
    small = run(chunked_gated_delta_rule, inputs, chunk_size=4)
    large = run(chunked_gated_delta_rule, inputs, chunk_size=16)
    total = sum(lens)
    np.testing.assert_allclose(small[0][:total], large[0][:total], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(small[1], large[1], rtol=1e-4, atol=1e-4)
    check_against_transformers(inputs, *small, recurrent=True)


def test_split_prompt_carries_its_state():
    """A prompt over two calls (the first's final states as the second's initial) equals it in one call, with the
    split inside a chunk so the second call's chunks start at its own first token."""
    lens = [21, 11]
    whole = ragged_inputs(lens, num_seqs=2, extra_tokens=0, seed=2)
    cut = [9, 4]  # tokens of each row in the first call
    first_rows = np.concatenate([np.arange(0, cut[0]), np.arange(lens[0], lens[0] + cut[1])])
    second_rows = np.concatenate([np.arange(cut[0], lens[0]), np.arange(lens[0] + cut[1], sum(lens))])

    def part(rows, row_lens, initial):
        tokens = {name: whole[name][rows] for name in ("q", "k", "v", "g", "beta")}
        return dict(tokens, initial=initial, num_seqs=whole["num_seqs"],
                    query_start_loc=np.array([0, row_lens[0], sum(row_lens)], np.int32))

    first_out, mid = run(chunked_gated_delta_rule, part(first_rows, cut, whole["initial"]), chunk_size=8)
    second_out, end = run(chunked_gated_delta_rule,
                          part(second_rows, [lens[0] - cut[0], lens[1] - cut[1]], mid), chunk_size=8)
    one_out, one_end = run(chunked_gated_delta_rule, whole, chunk_size=8)
    np.testing.assert_allclose(first_out, one_out[first_rows], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(second_out, one_out[second_rows], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(end, one_end, rtol=1e-4, atol=1e-4)

"""The ragged causal conv (vllm_jax/model/ssm/causal_conv.py) against transformers' own conv update (Qwen3.5's
`causal_conv1d_update`, which continues a conv state), one sequence at a time."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_update

from vllm_jax.model.ssm.causal_conv import causal_conv1d


@pytest.mark.parametrize("with_bias", [False, True])
def test_ragged_conv_equals_transformers_per_sequence(with_bias):
    rng = np.random.default_rng(0)
    channels, k = 6, 4
    lens = [5, 1, 0, 2, 9]  # a prefill, a decode, a padding row, a sequence shorter than the kernel, another
    num_seqs = 4  # the last row is padding too (past num_seqs)
    total = sum(lens[:num_seqs])
    num_tokens = total + 3  # bucket padding
    x = rng.normal(size=(num_tokens, channels)).astype(np.float32)
    weight = rng.normal(size=(channels, k)).astype(np.float32)
    bias = rng.normal(size=channels).astype(np.float32) if with_bias else None
    initial = rng.normal(size=(len(lens), k - 1, channels)).astype(np.float32)
    starts = np.concatenate([[0], np.cumsum(lens[:num_seqs])]).tolist()
    qsl = np.array(starts + [total] * (len(lens) - num_seqs), np.int32)
    y, final = causal_conv1d(jnp.asarray(x), jnp.asarray(weight), None if bias is None else jnp.asarray(bias),
                             jnp.asarray(initial), jnp.asarray(qsl), jnp.asarray([num_seqs], jnp.int32))
    y, final = np.asarray(y), np.asarray(final)
    for s in range(num_seqs):
        tokens = x[starts[s]:starts[s + 1]]
        state = torch.tensor(initial[s].T[None].copy())  # [1, C, K-1]
        if len(tokens):
            out = causal_conv1d_update(torch.tensor(tokens.T[None].copy()), state, torch.tensor(weight),
                                       None if bias is None else torch.tensor(bias), activation="silu")
            np.testing.assert_allclose(y[starts[s]:starts[s + 1]], out[0].T.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(final[s], state[0].T.numpy(), rtol=1e-6, atol=1e-6)
    for s in range(num_seqs, len(lens)):  # rows past num_seqs keep their state
        np.testing.assert_array_equal(final[s], initial[s])

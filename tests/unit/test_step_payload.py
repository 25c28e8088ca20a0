"""StepPayload's wire format (what process 0 broadcasts each step): bytes back to an equal payload, dtypes and
None fields kept (from_bytes reads with allow_pickle=False); the same for a proposal step's ProposalPayload."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vllm_jax.sample.metadata import RowSamplingInput, build_sampling_tensors
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.worker.batch import RowChunk, pack_step_inputs
from vllm_jax.worker.step_payload import StepPayload


def _payload(params: SamplingParams, prompt_targets: np.ndarray | None) -> StepPayload:
    inputs = pack_step_inputs([RowChunk([5, 6, 7], 2, [1, 3]), RowChunk([9], 0, [2])], block_size=4,
                              max_blocks_per_seq=4, num_tokens_padded=8, num_seqs_padded=4)
    rows = [RowSamplingInput(params, 2**40 + 3, [1, 5], [6], 5), RowSamplingInput(SamplingParams(), 7, [9], [], 1)]
    tensors, _ = build_sampling_tensors(rows, 4, 16)
    feedback = {} if prompt_targets is None else {  # the async-scheduling fields, in the second case only
        "input_token_slots": np.array([-1, -1, 4, -1, -1, -1, -1, -1], np.int32),
        "sample_slots": np.array([4, 0, 9, 9], np.int32)}
    return StepPayload(inputs, tensors, num_logprobs=3, prompt_targets=prompt_targets, **feedback)


def _assert_same(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x is None or y is None:
            assert x is None and y is None, f.name
        else:
            assert np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y), f.name


@pytest.mark.parametrize("params, targets", [
    (SamplingParams(temperature=0.7, top_p=0.9), None),  # basic sampling variant: every [S, V] field None
    (SamplingParams(repetition_penalty=1.2, logit_bias={3: 2.0}), np.arange(8, dtype=np.int32)),  # full variant
])
def test_bytes_round_trip_gives_back_every_field(params, targets):
    payload = _payload(params, targets)
    back = StepPayload.from_bytes(payload.to_bytes())
    assert back.num_logprobs == 3 and back.sampling.is_full == payload.sampling.is_full
    _assert_same(payload.inputs, back.inputs)
    _assert_same(payload.sampling, back.sampling)
    for name in ("prompt_targets", "input_token_slots", "sample_slots"):
        sent, got = getattr(payload, name), getattr(back, name)
        assert (got is None) == (targets is None) == (sent is None), name
        if sent is not None:
            assert got.dtype == sent.dtype and np.array_equal(got, sent), name



@pytest.mark.parametrize("method", ["draft_model", "eagle3_k1", "eagle3"])
def test_a_proposal_step_round_trips_and_is_told_from_a_step(method):
    """A draft model's chain, an EAGLE-3 head's catch-up alone (k = 1) or with its chain: what process 0
    broadcasts after a step; a follower tells it from a StepPayload by its first bytes."""
    from vllm_jax.spec_decode.device.draft_chain import pack_catch_up, pack_chain
    from vllm_jax.worker.step_payload import ProposalPayload

    chain = pack_chain(np.array([[5, 6, 7, 0], [9, 0, 0, 0]]), np.array([3, 1]), np.array([[1, 3], [2, 0]]),
                       np.array([2, 1]), k=2, block_size=4, max_model_len=16, num_tokens_padded=4,
                       num_seqs_padded=4).inputs
    payload = ProposalPayload(chain)
    if method != "draft_model":
        step = _payload(SamplingParams(), None).inputs
        catch_up, gather = pack_catch_up(step, np.array([3, 1]), np.array([6, 7, 8, 4], np.int32))
        payload = ProposalPayload(chain if method == "eagle3" else None, catch_up, gather)
    data = payload.to_bytes()
    assert ProposalPayload.is_proposal(data)
    assert not ProposalPayload.is_proposal(_payload(SamplingParams(), None).to_bytes())
    back = ProposalPayload.from_bytes(data)
    for name in ("chain", "catch_up"):
        sent, got = getattr(payload, name), getattr(back, name)
        assert (sent is None) == (got is None), name
        if sent is not None:
            _assert_same(sent, got)
    assert (back.gather is None) == (payload.gather is None)
    if payload.gather is not None:
        assert back.gather.dtype == payload.gather.dtype and np.array_equal(back.gather, payload.gather)

"""The persistent input batch (worker/input_batch.py) against a rebuild from scratch: after any sequence of
arrivals, departures, new blocks, progress and sampled tokens, the step's arrays gathered from its rows equal
what `pack_step_inputs` / `build_sampling_tensors` build from plain per-request lists."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from vllm_jax.sample.metadata import RowSamplingInput, build_sampling_tensors
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm_jax.worker.batch import RowChunk, pack_step_inputs
from vllm_jax.worker.input_batch import InputBatch

MAX_REQS, MAX_LEN, BLOCK, VOCAB = 6, 40, 4, 50
WIDTH = MAX_LEN // BLOCK + 1


@dataclasses.dataclass
class _Ref:
    """What a rebuild from scratch reads: plain lists per request."""

    tokens: list[int]
    blocks: list[int]
    num_computed: int
    params: SamplingParams
    seed: int


def _random_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(temperature=rng.choice([0.0, 0.7, 1.3]), top_p=rng.choice([1.0, 0.9]),
                          top_k=rng.choice([0, 5, VOCAB + 3]), min_p=rng.choice([0.0, 0.1]),
                          seed=None, logprobs=rng.choice([None, 0, 3]))


def _check_step(batch: InputBatch, refs: dict[str, _Ref], rng: random.Random) -> None:
    req_ids = list(refs)
    rng.shuffle(req_ids)  # any row order: the scheduler's
    counts = [rng.randint(1, len(refs[r].tokens) - refs[r].num_computed) for r in req_ids]
    slots = batch.slots(req_ids)
    counts_np = np.array(counts, np.int32)
    num_tokens, num_seqs = sum(counts) + rng.randint(0, 3), len(req_ids) + rng.randint(0, 2)
    got = batch.pack(slots, counts_np, block_size=BLOCK, num_tokens_padded=num_tokens, num_seqs_padded=num_seqs)
    want = pack_step_inputs([RowChunk(refs[r].tokens[refs[r].num_computed:refs[r].num_computed + n],
                                      refs[r].num_computed, refs[r].blocks) for r, n in zip(req_ids, counts)],
                            block_size=BLOCK, max_blocks_per_seq=WIDTH, num_tokens_padded=num_tokens,
                            num_seqs_padded=num_seqs)
    for field in dataclasses.fields(want):
        if getattr(want, field.name) is None:  # optional inputs (lora_slots) neither packs without LoRA
            assert getattr(got, field.name) is None, field.name
            continue
        np.testing.assert_array_equal(getattr(got, field.name), getattr(want, field.name), err_msg=field.name)
        assert getattr(got, field.name).dtype == getattr(want, field.name).dtype, field.name
    tensors, asked = batch.sampling_tensors(slots, counts_np, num_seqs)
    rows = [RowSamplingInput(refs[r].params, refs[r].seed, [], [], refs[r].num_computed + n)
            for r, n in zip(req_ids, counts)]
    want_tensors, want_asked = build_sampling_tensors(rows, num_seqs, VOCAB)
    assert asked == want_asked
    for field in dataclasses.fields(want_tensors):
        w = getattr(want_tensors, field.name)
        if w is None:
            assert getattr(tensors, field.name) is None
        else:
            np.testing.assert_array_equal(getattr(tensors, field.name), w, err_msg=field.name)
            assert getattr(tensors, field.name).dtype == w.dtype, field.name
    np.testing.assert_array_equal(batch.completes(slots, counts_np),
                                  [refs[r].num_computed + n >= len(refs[r].tokens) for r, n in zip(req_ids, counts)])


@pytest.mark.parametrize("seed", range(20))
def test_rows_updated_by_what_changed_pack_the_same_arrays_as_a_rebuild(seed):
    rng = random.Random(seed)
    batch = InputBatch(MAX_REQS, MAX_LEN, WIDTH, VOCAB)
    refs: dict[str, _Ref] = {}
    next_block, next_id = 1, 0
    for _ in range(60):
        new, cached, gone = [], CachedRequestData(), set()
        for req_id in list(refs):  # some leave (finished or preempted)
            if rng.random() < 0.15:
                gone.add(req_id)
                del refs[req_id]
        while len(refs) < MAX_REQS and rng.random() < 0.5:  # some arrive, some with a prefix already computed
            tokens = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]
            blocks = list(range(next_block, next_block + -(-len(tokens) // BLOCK) + rng.randint(0, 1)))
            next_block += len(blocks)
            ref = _Ref(tokens, blocks, rng.randint(0, len(tokens) - 1), _random_params(rng), rng.getrandbits(40))
            refs[str(next_id)] = ref
            new.append(NewRequestData(str(next_id), list(tokens), len(tokens), list(blocks), ref.num_computed,
                                      ref.params, ref.seed))
            next_id += 1
        for req_id, ref in refs.items():  # the others progress, sample, and now and then get a block
            if any(n.req_id == req_id for n in new):
                continue
            ref.num_computed = rng.randint(ref.num_computed, len(ref.tokens) - 1)
            # the blocks its tokens need, now and then one more
            needed = max(0, -(-len(ref.tokens) // BLOCK) - len(ref.blocks)) + (rng.random() < 0.2)
            added = list(range(next_block, next_block + min(needed, WIDTH - len(ref.blocks))))
            next_block += len(added)
            ref.blocks += added
            cached.req_ids.append(req_id)
            cached.new_block_ids.append(added)
            cached.num_computed_tokens.append(ref.num_computed)
        batch.update(SchedulerOutput(new, cached, {}, 0, finished_req_ids=gone))
        assert set(batch.slot_of) == set(refs)
        if refs:
            _check_step(batch, refs, rng)
            growing = [r for r in refs if len(refs[r].tokens) < MAX_LEN and rng.random() < 0.7]
            sampled = [rng.randrange(VOCAB) for _ in growing]
            batch.append_tokens(batch.slots(growing), np.array(sampled, np.int32))
            for req_id, token in zip(growing, sampled):
                refs[req_id].tokens.append(token)


def test_a_full_batch_says_so_and_a_departed_row_is_reused():
    batch = InputBatch(2, MAX_LEN, WIDTH, VOCAB)
    params = SamplingParams()
    batch.add("a", [1, 2], [1], 0, params, 0)
    batch.add("b", [3], [2], 0, params, 0)
    with pytest.raises(RuntimeError, match="max_num_seqs"):
        batch.add("c", [4], [3], 0, params, 0)
    slot = batch.slot_of["a"]
    batch.remove("a")
    batch.remove("never-held")  # finished before it ever ran: ignored
    assert batch.add("c", [4], [3], 0, params, 0) == slot
    np.testing.assert_array_equal(batch.block_table[slot], [3] + [0] * (WIDTH - 1))  # no stale blocks


def test_speculation_gives_logits_rows_beyond_max_num_seqs_up_to_the_tokens():
    """Issue #38: each proposal's logits row is bounded by the step's tokens, not by max_num_seqs."""
    from vllm_jax.worker.buckets import geometric_buckets, max_step_rows, seq_bucket_for

    assert max_step_rows(8, 32) == 8  # no speculation: max_num_seqs
    assert max_step_rows(1, 32, num_spec_tokens=4) == 5  # k = 4 at max_num_seqs 1
    assert max_step_rows(4, 512, num_spec_tokens=4, spec_batch_limit=2) == 4 + 2 * 4  # only 2 may propose
    assert max_step_rows(256, 512, num_spec_tokens=4) == 512  # never more rows than tokens
    assert max_step_rows(64, 32, num_spec_tokens=4) == 64  # nor fewer than max_num_seqs
    rows = max_step_rows(1, 32, num_spec_tokens=4)
    buckets = geometric_buckets(2, rows, 4)
    assert [seq_bucket_for(t, buckets, rows) for t in (2, 8, 32)] == [2, 5, 5]

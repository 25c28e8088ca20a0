"""The persistent input batch: every request the runner holds, as a row of preallocated numpy arrays.

vLLM's InputBatch idea (docs/architecture/01-overview.md, "Data flow of one step"): a step changes little (a new token
per decoding request, now and then a new block, a request arriving or leaving), so the rows are updated by what the
SchedulerOutput says changed, and a step's padded arrays are gathered from them with a few vectorized numpy
operations instead of a Python loop over the batch. Rows are slots taken from a free list and given back when a
request leaves; nothing is condensed, because the step's row order is the scheduler's (its
`num_scheduled_tokens` order) and a gather by slot serves any order. Pure numpy, no jax.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.sample.metadata import NO_LOGPROBS, may_need_full, seed_to_uint32
from vllm_jax.sample.sampler import SamplingTensors
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.scheduler.output import SchedulerOutput


class InputBatch:
    """Rows of token ids, KV progress, block tables and the basic sampling parameters, one per held request."""

    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_seq: int, vocab_size: int,
                 lora: bool = False, states: bool = False):
        """`lora`: the steps carry each token's LoRA slot (`StepInputs.lora_slots`); `states`: each row's state slot
        (`StepInputs.state_slots`, a hybrid model's)."""
        self.vocab_size = vocab_size
        self.lora = lora
        self.states = states
        # each row's state slot (0: none), the slot its next step reads (a hit's snapshot at first), and the snapshot
        # slot this step also writes (0: none)
        self.state_slot = np.zeros(max_num_reqs, np.int32)
        self.state_read = np.zeros(max_num_reqs, np.int32)
        self.state_snapshot = np.zeros(max_num_reqs, np.int32)
        self.lora_slot = np.zeros(max_num_reqs, np.int32)  # each row's LoRA slot (0: no adapter)
        # +1: the token sampled after the last position a request may compute is appended before it stops
        self.token_ids = np.zeros((max_num_reqs, max_model_len + 1), np.int32)
        self.num_tokens = np.zeros(max_num_reqs, np.int32)  # known tokens (prompt + outputs)
        self.num_computed = np.zeros(max_num_reqs, np.int32)  # tokens with KV, as the scheduler last said
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_seq), np.int32)  # zeros past num_blocks
        self.num_blocks = np.zeros(max_num_reqs, np.int32)
        self.temperature = np.zeros(max_num_reqs, np.float32)
        self.top_p = np.ones(max_num_reqs, np.float32)
        self.top_k = np.zeros(max_num_reqs, np.int32)  # 0: every token (k >= vocab is stored as 0)
        self.min_p = np.zeros(max_num_reqs, np.float32)
        self.seeds = np.zeros(max_num_reqs, np.uint32)
        self.logprobs = np.full(max_num_reqs, NO_LOGPROBS, np.int32)
        # a row whose params may need the full sampler variant (penalties, bias, masks, min_tokens)
        self.may_need_full = np.zeros(max_num_reqs, np.bool_)
        self.wants_prompt_logprobs = np.zeros(max_num_reqs, np.bool_)
        self.num_slots = max_num_reqs
        # Which request holds each slot: a number given at add, 0 when free. A step dispatched before a row's
        # request left (async scheduling) tells by it that the row is no longer that request's, even when the slot
        # went to a new request of the same id.
        self.holder = np.zeros(max_num_reqs, np.int64)
        self._holders = 0
        self.slot_of: dict[str, int] = {}
        self._free = list(range(max_num_reqs - 1, -1, -1))  # pop() hands out the lowest slot first

    # --- what changed ---
    def update(self, sched: SchedulerOutput) -> None:
        """Apply one SchedulerOutput: drop finished and preempted requests, add new (or resumed) ones, extend
        the running ones (new blocks, the scheduler's progress)."""
        for req_id in sched.finished_req_ids | sched.preempted_req_ids:
            self.remove(req_id)
        for new in sched.scheduled_new_reqs:
            self.add(new.req_id, new.token_ids, new.block_ids, new.num_computed_tokens, new.sampling_params,
                     new.seed, new.lora_slot, new.state_slot, new.state_source)
        cached = sched.scheduled_cached_reqs
        if self.states:
            self._update_states(cached.req_ids, sched.state_snapshots)
        if not cached.req_ids:
            return
        slots = self.slots(cached.req_ids)
        self.num_computed[slots] = cached.num_computed_tokens
        for slot, block_ids in zip(slots.tolist(), cached.new_block_ids):
            if block_ids:
                self.append_blocks(slot, block_ids)

    def _update_states(self, cached_req_ids: list[str], snapshots: dict[str, int]) -> None:
        """Rows past their first step read their own slot; this step's snapshot slots."""
        if cached_req_ids:
            rows = self.slots(cached_req_ids)
            self.state_read[rows] = self.state_slot[rows]
        self.state_snapshot[:] = 0
        for req_id, slot in snapshots.items():
            self.state_snapshot[self.slot_of[req_id]] = slot

    def add(self, req_id: str, token_ids: Sequence[int], block_ids: Sequence[int], num_computed: int,
            params: SamplingParams, seed: int, lora_slot: int = 0, state_slot: int = 0, state_source: int = 0) -> int:
        if req_id in self.slot_of:
            raise ValueError(f"request {req_id!r} already has a row")
        if not self._free:
            raise RuntimeError(f"the input batch is full ({len(self.num_tokens)} rows): more requests held than "
                               f"max_num_seqs")
        slot = self._free.pop()
        self.slot_of[req_id] = slot
        self._holders += 1
        self.holder[slot] = self._holders
        n = len(token_ids)
        self.token_ids[slot, :n] = token_ids
        self.num_tokens[slot] = n
        self.num_computed[slot] = num_computed
        self.block_table[slot] = 0
        self.num_blocks[slot] = 0
        self.append_blocks(slot, block_ids)
        self.temperature[slot] = params.temperature
        self.top_p[slot] = params.top_p
        self.top_k[slot] = params.top_k if params.top_k < self.vocab_size else 0
        self.min_p[slot] = params.min_p
        self.seeds[slot] = seed_to_uint32(seed)
        self.logprobs[slot] = NO_LOGPROBS if params.logprobs is None else params.logprobs
        self.may_need_full[slot] = may_need_full(params)
        self.wants_prompt_logprobs[slot] = params.prompt_logprobs is not None
        self.lora_slot[slot] = lora_slot
        self.state_slot[slot] = state_slot
        self.state_read[slot] = state_source or state_slot
        return slot

    def remove(self, req_id: str) -> None:
        """Give a request's row back (unknown ids are ignored: a request may finish before it ever ran)."""
        slot = self.slot_of.pop(req_id, None)
        if slot is not None:
            self.holder[slot] = 0
            self._free.append(slot)

    def append_blocks(self, slot: int, block_ids: Sequence[int]) -> None:
        start = int(self.num_blocks[slot])
        self.block_table[slot, start:start + len(block_ids)] = block_ids
        self.num_blocks[slot] = start + len(block_ids)

    def append_tokens(self, slots: np.ndarray, token_ids: np.ndarray) -> None:
        """One sampled token per slot (slots distinct)."""
        self.token_ids[slots, self.num_tokens[slots]] = token_ids
        self.num_tokens[slots] += 1

    def append_token_run(self, slot: int, token_ids: Sequence[int]) -> None:
        """Several tokens for one slot (accepted proposals and the token after them)."""
        n = int(self.num_tokens[slot])
        self.token_ids[slot, n:n + len(token_ids)] = token_ids
        self.num_tokens[slot] = n + len(token_ids)

    def write_drafts(self, slots: np.ndarray, drafts: Sequence[Sequence[int]]) -> None:
        """Proposed tokens after each slot's known ones, where `pack` reads a step's inputs; not known tokens
        (`num_tokens` stays): the step's accepted tokens overwrite them."""
        for slot, draft in zip(slots.tolist(), drafts):
            if len(draft):
                n = int(self.num_tokens[slot])
                self.token_ids[slot, n:n + len(draft)] = draft

    def slots(self, req_ids: Sequence[str]) -> np.ndarray:
        return np.fromiter((self.slot_of[r] for r in req_ids), np.int64, len(req_ids))

    # --- one step ---
    def pack(self, slots: np.ndarray, counts: np.ndarray, *, block_size: int, num_tokens_padded: int,
             num_seqs_padded: int, num_drafts: np.ndarray | None = None) -> StepInputs:
        """The step's padded arrays (docs/architecture/05-worker.md, "The step's arrays") for `counts[i]` tokens of the
        request in `slots[i]`, after those already computed; the same arrays `batch.pack_step_inputs` builds.

        `num_drafts[i]` of a row's tokens are proposals to verify: that row's last 1 + num_drafts[i] positions
        each get a logits row (`logits_indices`), in row order
        (docs/architecture/08-sampling.md, "Speculative decoding")."""
        num_seqs, total = len(slots), int(counts.sum())
        if total > num_tokens_padded or num_seqs > num_seqs_padded:
            raise ValueError(f"batch of {total} tokens / {num_seqs} rows exceeds bucket "
                             f"({num_tokens_padded}, {num_seqs_padded})")
        query_start_loc = np.full(num_seqs_padded + 1, total, np.int32)
        query_start_loc[0] = 0
        np.cumsum(counts, out=query_start_loc[1:num_seqs + 1])
        starts = self.num_computed[slots]
        token_slot = np.repeat(slots, counts)
        pos = (np.repeat(starts - query_start_loc[:num_seqs], counts) + np.arange(total, dtype=np.int32))
        input_ids = np.zeros(num_tokens_padded, np.int32)
        positions = np.zeros(num_tokens_padded, np.int32)
        slot_mapping = np.zeros(num_tokens_padded, np.int32)  # padding writes the null block
        input_ids[:total] = self.token_ids[token_slot, pos]
        positions[:total] = pos
        slot_mapping[:total] = self.block_table[token_slot, pos // block_size] * block_size + pos % block_size
        block_tables = np.zeros((num_seqs_padded, self.block_table.shape[1]), np.int32)
        block_tables[:num_seqs] = self.block_table[slots]
        seq_lens = np.zeros(num_seqs_padded, np.int32)
        seq_lens[:num_seqs] = starts + counts
        logits_indices = np.zeros(num_seqs_padded, np.int32)
        ends = query_start_loc[1:num_seqs + 1]
        if num_drafts is None:
            logits_indices[:num_seqs] = ends - 1
        else:
            rows = counts_to_rows(num_drafts + 1)
            if len(rows) > num_seqs_padded:
                raise ValueError(f"{len(rows)} logits rows exceed the sequence bucket {num_seqs_padded}")
            logits_indices[:len(rows)] = np.repeat(ends - 1 - num_drafts, num_drafts + 1) + rows
        lora_slots = None
        if self.lora:  # padding tokens: slot 0 (no adapter)
            lora_slots = np.zeros(num_tokens_padded, np.int32)
            lora_slots[:total] = self.lora_slot[token_slot]
        reads = writes = snapshots = None
        if self.states:  # padding rows: the null slot
            reads, writes, snapshots = (np.zeros(num_seqs_padded, np.int32) for _ in range(3))
            reads[:num_seqs], writes[:num_seqs] = self.state_read[slots], self.state_slot[slots]
            snapshots[:num_seqs] = self.state_snapshot[slots]
        return StepInputs(input_ids=input_ids, positions=positions, slot_mapping=slot_mapping,
                          block_tables=block_tables, seq_lens=seq_lens, query_start_loc=query_start_loc,
                          num_seqs=np.array([num_seqs], np.int32), logits_indices=logits_indices,
                          lora_slots=lora_slots, state_reads=reads, state_slots=writes, state_snapshots=snapshots)

    def sampling_tensors(self, slots: np.ndarray, counts: np.ndarray, num_seqs_padded: int,
                         num_drafts: np.ndarray | None = None) -> tuple[SamplingTensors, int]:
        """The basic sampler variant's arrays and the widest logprobs asked, as `build_sampling_tensors` gives
        them for rows that need no full variant (the caller checks `may_need_full` and grammar rows).

        With `num_drafts`, one row per logits row (`pack`): a request's params repeated over its verified
        positions, each with its own position (the RNG counter)."""
        positions_of = self.num_computed[slots] + counts  # the RNG counter: the sampled token's position
        if num_drafts is not None:
            repeats = num_drafts + 1
            positions_of = np.repeat(positions_of - num_drafts, repeats) + counts_to_rows(repeats)
            slots = np.repeat(slots, repeats)
        n = len(slots)

        def rows(values: np.ndarray, pad: float | int) -> np.ndarray:
            out = np.full(num_seqs_padded, pad, values.dtype)
            out[:n] = values[slots]
            return out

        positions = np.zeros(num_seqs_padded, np.int32)
        positions[:n] = positions_of
        tensors = SamplingTensors(temperature=rows(self.temperature, 0), top_p=rows(self.top_p, 1),
                                  top_k=rows(self.top_k, 0), min_p=rows(self.min_p, 0), seeds=rows(self.seeds, 0),
                                  positions=positions)
        return tensors, int(self.logprobs[slots].max(initial=NO_LOGPROBS))

    def pending_token_slots(self, slots: np.ndarray, counts: np.ndarray, inputs: StepInputs,
                            num_drafts: np.ndarray | None = None) -> np.ndarray | None:
        """[T]: for each token of `inputs` the host does not know yet, its row's slot, else -1; None if none.

        Under async scheduling a decoding row's input token is the one its previous step is still sampling on the
        device (docs/architecture/02-engine.md, "Async scheduling"). Only a row's last token can be that one, and only
        one step is ever in flight, so a row lacks at most one token."""
        last = self.num_computed[slots] + counts - 1  # each row's last position this step, proposals aside
        if num_drafts is not None:
            last = last - num_drafts
        known = self.num_tokens[slots]
        pending = last >= known
        if not pending.any():
            return None
        if (last > known).any():
            raise RuntimeError("a row is scheduled past the one token still being sampled for it")
        out = np.full(inputs.input_ids.shape[0], -1, np.int32)
        last_index = inputs.query_start_loc[1:len(slots) + 1] - 1  # where each row's last known token sits
        if num_drafts is not None:
            last_index = last_index - num_drafts
        out[last_index[pending]] = slots[pending]
        return out

    def completes(self, slots: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Per row: whether this step computes every known token, so its last logits sample a new one."""
        return self.num_computed[slots] + counts >= self.num_tokens[slots]



def counts_to_rows(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., counts[0] - 1, 0, 1, ..., counts[1] - 1, ...: each element's index inside its group."""
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total, dtype=np.int32) - starts.astype(np.int32)

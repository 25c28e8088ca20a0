"""The runner's persistent per-request state, kept in step with the scheduler's messages.

A SchedulerOutput carries only what changed (new requests whole, running ones as new block ids and progress), so
the runner keeps each scheduled request's tokens and sampling parameters between steps, as vLLM's
CachedRequestState does. These Python lists serve the rarer paths (the full sampler variant's rows, prompt
logprobs); the numbers every step packs, blocks included, live in the runner's InputBatch
(worker/input_batch.py), updated from the same messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vllm_jax.sample.metadata import RowSamplingInput
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.scheduler.output import SchedulerOutput


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int
    sampling_params: SamplingParams
    seed: int
    output_token_ids: list[int] = field(default_factory=list)

    def sampling_input(self, num_tokens: int, drafts: Sequence[int] = ()) -> RowSamplingInput:
        """The sampler's row; the RNG counter is the position of the token sampled after this step's tokens.
        `drafts`: the proposals verified before this row, which it reads as outputs (speculative decoding)."""
        outputs = self.output_token_ids + list(drafts) if len(drafts) else self.output_token_ids
        return RowSamplingInput(self.sampling_params, self.seed, self.token_ids[:self.num_prompt_tokens],
                                outputs, self.num_computed_tokens + num_tokens)

    def append_sampled(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)


def update_request_states(states: dict[str, CachedRequestState], sched: SchedulerOutput) -> None:
    """Drop finished and preempted requests, add new (or resumed) ones, advance the running ones (their blocks
    live in the InputBatch only)."""
    for req_id in sched.finished_req_ids | sched.preempted_req_ids:
        states.pop(req_id, None)
    for new in sched.scheduled_new_reqs:
        states[new.req_id] = CachedRequestState(
            new.req_id, list(new.token_ids), new.num_prompt_tokens, new.num_computed_tokens,
            new.sampling_params, new.seed, output_token_ids=list(new.token_ids[new.num_prompt_tokens:]))
    cached = sched.scheduled_cached_reqs
    for req_id, num_computed in zip(cached.req_ids, cached.num_computed_tokens):
        states[req_id].num_computed_tokens = num_computed

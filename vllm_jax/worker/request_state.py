"""The runner's persistent per-request state, kept in step with the scheduler's messages.

A SchedulerOutput carries only what changed (new requests whole, running ones as new block ids and progress), so
the runner keeps each scheduled request's tokens, blocks and sampling parameters between steps, as vLLM's
CachedRequestState does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_jax.sample.metadata import RowSamplingInput
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.scheduler.output import SchedulerOutput
from vllm_jax.worker.batch import RowChunk


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    block_ids: list[int]
    num_computed_tokens: int
    sampling_params: SamplingParams
    seed: int
    output_token_ids: list[int] = field(default_factory=list)

    def row_chunk(self, num_tokens: int) -> RowChunk:
        """This step's tokens of the request, after those already in the KV cache."""
        start = self.num_computed_tokens
        return RowChunk(self.token_ids[start:start + num_tokens], start, self.block_ids)

    def sampling_input(self, num_tokens: int) -> RowSamplingInput:
        """The sampler's row; the RNG counter is the position of the token sampled after this step's tokens."""
        return RowSamplingInput(self.sampling_params, self.seed, self.token_ids[:self.num_prompt_tokens],
                                self.output_token_ids, self.num_computed_tokens + num_tokens)

    def completes_after(self, num_tokens: int) -> bool:
        """Whether this step computes every known token, so its last logits sample a new one."""
        return self.num_computed_tokens + num_tokens >= len(self.token_ids)

    def append_sampled(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)


def update_request_states(states: dict[str, CachedRequestState], sched: SchedulerOutput) -> None:
    """Drop finished and preempted requests, add new (or resumed) ones, extend the running ones."""
    for req_id in sched.finished_req_ids | sched.preempted_req_ids:
        states.pop(req_id, None)
    for new in sched.scheduled_new_reqs:
        states[new.req_id] = CachedRequestState(
            new.req_id, list(new.token_ids), new.num_prompt_tokens, list(new.block_ids), new.num_computed_tokens,
            new.sampling_params, new.seed, output_token_ids=list(new.token_ids[new.num_prompt_tokens:]))
    for cached in sched.scheduled_cached_reqs:
        state = states[cached.req_id]
        state.block_ids.extend(cached.new_block_ids)
        state.num_computed_tokens = cached.num_computed_tokens

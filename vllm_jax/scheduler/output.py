"""The messages between the scheduler, the model runner and the output processor.

One engine step: `Scheduler.schedule() -> SchedulerOutput`; `ModelRunner.execute(SchedulerOutput) ->
ModelRunnerOutput`; `Scheduler.update_from_output(SchedulerOutput, ModelRunnerOutput) -> list[EngineCoreOutput]`;
the output processor turns those into `RequestOutput`s. Pure Python, no jax.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_jax.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request the runner has no state for: first scheduled, or resumed after preemption.

    `token_ids` is everything known so far (prompt + outputs already generated), so a resumed request
    recomputes its KV from scratch (preemption by recompute).
    """

    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    block_ids: list[int]
    num_computed_tokens: int  # prefix-cache hit (tokens whose KV is already in `block_ids`)
    sampling_params: SamplingParams
    seed: int  # the request's sampling seed (random at arrival when the user gave none)
    lora_slot: int = 0  # the device LoRA slot its tokens read (0: no adapter)
    state_slot: int = 0  # a hybrid model's state slot (paged_kv/recurrent_states.py; 0: none)
    state_source: int = 0  # the slot its first step reads states from: a prefix hit's snapshot (0: its own slot)
    mm_inputs: Any = None  # its images (multimodal/inputs.py MultiModalInputs), None: text only


@dataclass
class CachedRequestData:
    """The requests the runner already holds, batched as in vLLM (one list per field, in the same order): only
    what changed since the last step. Lists, not an object per request: a step has hundreds."""

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)  # [] for a request without new blocks
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    # req_id -> tokens to compute this step; iteration order == batch row order
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # requests the runner must drop (finished or aborted since the last step, or preempted this step)
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    # req_id -> [1 + d, ceil(V / 32)] int32 numpy rows: the allowed tokens of a constrained request that samples
    # this step, one row per logits row (d: its proposals; row j masks as after proposals 0..j-1)
    grammar_bitmask: dict[str, Any] = field(default_factory=dict)
    # req_id -> the scheduler's Request object (the scheduler's own bookkeeping, not for the runner): under async
    # scheduling a request may end and its id be reused before this step's output arrives.
    scheduled_requests: dict[str, Any] = field(default_factory=dict, repr=False)
    # Speculative decoding: req_id -> the proposed tokens this step verifies (the last ones of its scheduled
    # tokens; requests without proposals are absent)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # LoRA: slot -> the adapter to write there before this step runs (newly resident adapters only)
    lora_loads: dict[int, Any] = field(default_factory=dict)
    # Multi-step decoding (scheduler/multi_step.py): the step runs up to `num_steps` decode tokens per request on the
    # device; `step_limits`: req_id -> the most it samples (its KV slots are allocated). 1 / empty: one token.
    num_steps: int = 1
    step_limits: dict[str, int] = field(default_factory=dict)
    # A hybrid model with prefix caching: req_id -> the snapshot slot its step also writes its end states to (the
    # step ends on a block boundary: paged_kv/state_snapshots.py); absent: none
    state_snapshots: dict[str, int] = field(default_factory=dict)


@dataclass
class ModelRunnerOutput:
    """Per scheduled request, in `num_scheduled_tokens` order."""

    req_ids: list[str]
    # the sampled token, or [] for a request whose prompt is not complete yet (partial prefill chunk); with
    # speculative decoding, the accepted proposals then the token sampled after them
    sampled_token_ids: list[list[int]]
    # per request: one (token_ids, logprobs, ranks) per sampled token (that token then the top-N), or None
    logprobs: list[list[tuple[list[int], list[float], list[int]]] | None] | None = None
    # req_id -> list of per-position (token_ids, logprobs, ranks) for prompt positions computed this step
    prompt_logprobs: dict[str, list[tuple[list[int], list[float], list[int]]]] = field(default_factory=dict)
    # speculative decoding: req_id -> the tokens proposed for its next step
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # the pooling runner: req_id -> the pooled vector of a prompt whose last chunk ran this step
    pooler_output: dict[str, list[float]] = field(default_factory=dict)


@dataclass(slots=True)  # one per request per step
class EngineCoreOutput:
    """What a step produced for one request."""

    req_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    new_logprobs: list[tuple[list[int], list[float], list[int]]] | None = None
    new_prompt_logprobs: list[tuple[list[int], list[float], list[int]]] | None = None
    num_cached_tokens: int = 0


@dataclass
class SpecDecodeCounts:
    """Cumulative speculative-decoding counts (vLLM's `vllm:spec_decode_*` metrics), kept by the scheduler."""

    num_drafts: int = 0  # requests x steps that verified at least one proposed token
    num_draft_tokens: int = 0  # proposed tokens verified
    num_accepted_tokens: int = 0  # of those, accepted
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)  # [k]: accepted at proposal position i

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One request's verification: `num_accepted` of its `num_draft_tokens` proposals accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.num_accepted_tokens_per_pos) < num_draft_tokens:
            self.num_accepted_tokens_per_pos.extend([0] * (num_draft_tokens - len(self.num_accepted_tokens_per_pos)))
        for i in range(num_accepted):
            self.num_accepted_tokens_per_pos[i] += 1

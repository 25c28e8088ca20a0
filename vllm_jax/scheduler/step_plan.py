"""What one Scheduler.schedule() call has decided so far (the scheduler's working state within a step), and the
step's message to the runner that the finished plan becomes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_jax.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm_jax.scheduler.request import Request


@dataclass
class StepPlan:
    """What one schedule() call has decided so far. `num_scheduled`'s order is the batch's row order: running
    requests first, in order, then newcomers."""

    budget: int  # tokens still free this step
    num_scheduled: dict[str, int] = field(default_factory=dict)
    running: list[Request] = field(default_factory=list)  # scheduled requests that were already running
    new_block_ids: dict[str, list[int]] = field(default_factory=dict)  # for `running` only
    new: list[Request] = field(default_factory=list)  # admitted from the waiting queue
    preempted: list[Request] = field(default_factory=list)
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)  # the proposals each request verifies
    lora_loads: dict = field(default_factory=dict)  # LoRA slot -> the adapter newly made resident there

    def add_running(self, request: Request, num_tokens: int, new_block_ids: list[int],
                    spec_tokens: list[int] | None = None) -> None:
        req_id = request.request_id
        self.running.append(request)
        self.new_block_ids[req_id] = new_block_ids
        if spec_tokens:
            self.spec_tokens[req_id] = spec_tokens
        self.num_scheduled[req_id] = num_tokens  # _take, inlined: once per running request per step
        self.budget -= num_tokens

    def add_new(self, request: Request, num_tokens: int) -> None:
        self.new.append(request)
        self._take(request, num_tokens)

    def unschedule(self, request: Request) -> None:
        """Drop a running request planned earlier (now a victim) and give its tokens back; no-op otherwise."""
        num_tokens = self.num_scheduled.pop(request.request_id, None)
        if num_tokens is None:
            return
        self.running.remove(request)
        del self.new_block_ids[request.request_id]
        self.spec_tokens.pop(request.request_id, None)
        self.budget += num_tokens

    def scheduler_output(self, block_ids: Callable[[str], list[int]], finished_req_ids: set[str],
                         state_slots: Callable[[str], tuple[int, int, int]] | None = None) -> SchedulerOutput:
        """The step's message to the runner (`block_ids`: a newcomer's blocks by request id; `state_slots`: a hybrid
        model's (live, read, snapshot) slots of a request's step, KVCacheManager.state_slots_of);
        `num_computed_tokens` are the values before this step's tokens."""
        slots = state_slots or (lambda req_id: (0, 0, 0))
        return SchedulerOutput(
            scheduled_new_reqs=[NewRequestData(
                req_id=r.request_id, token_ids=list(r.all_token_ids), num_prompt_tokens=r.num_prompt_tokens,
                block_ids=block_ids(r.request_id),
                num_computed_tokens=r.num_computed_tokens, sampling_params=r.sampling_params, seed=r.seed,
                lora_slot=r.lora_slot, mm_inputs=r.mm_inputs, state_slot=(states := slots(r.request_id))[0],
                state_source=states[1])
                for r in self.new],
            scheduled_cached_reqs=CachedRequestData(
                req_ids=(cached_ids := [r.request_id for r in self.running]),
                new_block_ids=[self.new_block_ids[req_id] for req_id in cached_ids],
                num_computed_tokens=[r.num_computed_tokens for r in self.running]),
            num_scheduled_tokens=self.num_scheduled,
            total_num_scheduled_tokens=sum(self.num_scheduled.values()),
            finished_req_ids=finished_req_ids,
            preempted_req_ids={r.request_id for r in self.preempted},
            scheduled_spec_decode_tokens=self.spec_tokens,
            lora_loads=self.lora_loads,
            state_snapshots={} if state_slots is None else {
                r.request_id: snapshot for r in self.running + self.new if (snapshot := slots(r.request_id)[2])},
        )

    def _take(self, request: Request, num_tokens: int) -> None:
        self.num_scheduled[request.request_id] = num_tokens
        self.budget -= num_tokens

"""Continuous batching with vLLM v1 semantics: one token budget per step shared by all requests.

There are no prefill/decode phases: every request asks for the tokens it lacks (the prompt remainder,
or 1 when decoding). RUNNING requests are served first, in order; when the KV cache cannot hold a
running request's next tokens, a victim is preempted (by recompute: blocks freed, progress reset) and
the allocation retried. WAITING requests are admitted only in steps without preemption, so a step
never frees a victim's blocks just to hand them to a newcomer.

Anti-thrashing: a request resumed after a preemption is not chosen as a victim again until it has sampled a new
output token (`Request.awaiting_progress`): the victim is the policy's choice (fcfs: the last running request,
priority: the lowest priority, then the latest arrival) among the running requests that do not await progress.
Only when every running request awaits progress does the policy choose among all of them, so a step can always
make room or give up its own request; such a forced choice is counted in `num_preemptions_without_progress`.
(docs/architecture/03-scheduler.md, "Scheduling")

Async scheduling (vLLM's): the engine may call schedule() for step n + 1 before update_from_output() of step n.
A request sampling in step n then holds a placeholder (`Request.num_output_placeholders`) that step n + 1
computes as its next input token; one that step n ends by length, or whose inputs need that token on the host, sits
step n + 1 out. update_from_output() drops the rows of requests that ended meanwhile, so a token sampled past a
stop is never emitted (docs/architecture/02-engine.md, "Async scheduling").

Speculative decoding (vLLM's): a decoding request with proposals (`Request.spec_token_ids`) schedules them after
its next token; they count against the token budget, and each verified position is a logits row, so the step's
rows (requests plus proposals) stay within max_num_seqs. Proposals are dropped before anybody is preempted for
them, and update_from_output rolls `num_computed_tokens` back past the rejected ones (docs/architecture/08-sampling.md,
"Speculative decoding").

LoRA (vLLM's): admitting a request with an adapter pins the adapter's device slot (`LoRASlots`, LRU over the
unpinned slots); a request whose adapter is not resident while every slot is pinned by running requests of other
adapters stays waiting, and admission goes on with the requests behind it. Slots are released when a request
finishes or is preempted (docs/architecture/11-lora.md, "LoRA adapters").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from vllm_jax.config import SchedulerConfig
from vllm_jax.lora.slots import LoRASlots
from vllm_jax.paged_kv.kv_cache_manager import KVCacheManager
from vllm_jax.scheduler.multi_step import chunk_limits, decodes_on_device
from vllm_jax.scheduler.output import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput, SpecDecodeCounts
from vllm_jax.scheduler.policy import next_waiting, pick_victim
from vllm_jax.scheduler.request import Request, RequestStatus, check_context_length, check_stop
from vllm_jax.scheduler.request_outputs import grammar_bitmasks, grammar_stops, new_prompt_logprobs, step_starts
from vllm_jax.scheduler.step_plan import StepPlan


class Scheduler:
    """`scheduler_config` arrives validated (EngineArgs.create_config): its policy is "fcfs" or "priority"."""

    def __init__(self, scheduler_config: SchedulerConfig, kv_cache_manager: KVCacheManager, block_size: int,
                 num_spec_tokens: int = 0, spec_disable_batch_size: int | None = None,
                 num_lookahead_tokens: int = 0, lora_slots: LoRASlots | None = None) -> None:
        """`num_spec_tokens`: speculative decoding's k (0: off); `spec_disable_batch_size`: no proposals are
        scheduled while more requests than this run; `num_lookahead_tokens`: slots a request gets beyond each
        step's tokens when they are free (a draft model's proposals write KV there; never a preemption)."""
        self.config = scheduler_config
        self.kv_cache_manager = kv_cache_manager
        self.block_size = block_size
        self.max_model_len = scheduler_config.max_model_len
        self.requests: dict[str, Request] = {}  # unfinished requests only
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()  # since the last schedule()
        self.num_preemptions_total = 0
        self.num_preemptions_without_progress = 0  # victims that had not progressed since resuming (forced)
        self.num_spec_tokens = num_spec_tokens
        self.spec_disable_batch_size = spec_disable_batch_size
        self.num_lookahead_tokens = num_lookahead_tokens
        self.spec_decode_counts = SpecDecodeCounts(num_accepted_tokens_per_pos=[0] * num_spec_tokens)
        self.lora_slots = lora_slots  # LoRA's device slots (None: LoRA off)

    # ---- admission and bookkeeping ------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a request, rejecting what could never run (ValueError with the numbers)."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        prompt_len = request.num_prompt_tokens
        if prompt_len == 0:
            raise ValueError("the prompt is empty; at least one prompt token is required")
        if request.max_model_len is None:
            request.max_model_len = self.max_model_len
        check_context_length(prompt_len, request.sampling_params.max_tokens, self.max_model_len)
        max_tokens = request.max_tokens
        usable_blocks = self.kv_cache_manager.num_usable_blocks
        needed_blocks = self.kv_cache_manager.num_blocks_for(prompt_len + max_tokens)
        if needed_blocks > usable_blocks:
            raise ValueError(f"prompt ({prompt_len} tokens) plus max_tokens ({max_tokens}) needs {needed_blocks} "
                             f"KV blocks, but the KV cache has only {usable_blocks} blocks of {self.block_size} "
                             f"tokens")
        if not self.config.enable_chunked_prefill and prompt_len > self.config.max_num_batched_tokens:
            raise ValueError(f"prompt has {prompt_len} tokens, more than max_num_batched_tokens "
                             f"({self.config.max_num_batched_tokens}), and chunked prefill is disabled")
        if request.lora_request is not None and self.lora_slots is None:
            raise ValueError("the request has a lora_request, but LoRA is not enabled (enable_lora)")
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, req_ids: str | Iterable[str], status: RequestStatus) -> list[str]:
        """End requests from outside (abort, stop string): blocks are freed now. Unknown ids are ignored.

        Call between steps. Under async scheduling a dispatched step may still write the request's KV into the
        freed blocks: harmless, because the device runs steps in order, so any later owner of a block writes it
        after that step. Returns the ids actually finished.
        """
        if not status.is_finished:
            raise ValueError(f"{status} is not a finished status")
        if isinstance(req_ids, str):
            req_ids = [req_ids]
        done = []
        for req_id in req_ids:
            request = self.requests.get(req_id)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)
            done.append(req_id)
        return done

    def abort(self, req_id: str) -> None:
        self.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)

    def _free_request(self, request: Request) -> None:
        self._release_lora(request)
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting)

    def next_step_may_chunk(self) -> bool:
        """Whether the next schedule() could make a multi-step chunk once the step in flight is done: every
        running request samples in it and decodes on the device, and nobody waits who could be admitted. The
        engine then does not schedule ahead (a chunk needs its requests' tokens on the host)."""
        if self.config.num_scheduler_steps <= 1 or not self.running:
            return False
        if self.waiting and len(self.running) < self.config.max_num_seqs:
            return False
        return all(r.num_computed_tokens >= r.num_tokens and decodes_on_device(r) for r in self.running)

    def has_finished_requests(self) -> bool:
        """Finished ids not yet reported to the runner (one more schedule() delivers them)."""
        return bool(self.finished_req_ids)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    # ---- one step -----------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Decide this step's batch (docs/architecture/03-scheduler.md, "Scheduling"): running requests first, then,
        only in a step that preempted nobody, waiting ones."""
        plan = StepPlan(budget=self.config.max_num_batched_tokens)
        self.kv_cache_manager.begin_step()
        self._schedule_running(plan)
        if not plan.preempted:
            self._schedule_waiting(plan)
        limits = chunk_limits(plan, self.config.num_scheduler_steps, self.max_model_len, self.kv_cache_manager)
        manager = self.kv_cache_manager
        output = plan.scheduler_output(manager.get_block_ids, self.finished_req_ids,
                                       manager.state_slots_of if manager.states is not None else None)
        if limits is not None:  # a multi-step chunk (scheduler/multi_step.py)
            output.num_steps, output.step_limits = self.config.num_scheduler_steps, limits
        output.grammar_bitmask = grammar_bitmasks(plan.running + plan.new, plan.num_scheduled, plan.spec_tokens)
        output.scheduled_requests = {r.request_id: r for r in plan.running + plan.new}
        self.finished_req_ids = set()
        # vLLM v1: progress advances at scheduling time; the output above carries the values before it. A request
        # scheduled up to its last token samples one more: a placeholder until update_from_output brings it.
        num_scheduled = plan.num_scheduled
        for request in plan.running + plan.new:
            computed = request.num_computed_tokens + num_scheduled[request.request_id]
            if limits is not None:  # the chunk computes its own samples too; its tokens arrive at once
                computed += limits[request.request_id] - 1
            request.num_computed_tokens = computed
            if computed >= request.num_tokens + request.num_output_placeholders:
                request.num_output_placeholders += 1
        return output

    def _schedule_running(self, plan: StepPlan) -> None:
        """Give each running request, in order, the tokens it lacks (capped by the budget), preempting victims
        when its blocks cannot be had.

        Invariant: `self.running` is always the requests already planned (in order), then the one being planned,
        then those not reached yet; a victim leaves it wherever it sits, so the snapshot below skips victims
        that were not reached yet by their status.
        """
        speculates = self.num_spec_tokens > 0 and (self.spec_disable_batch_size is None
                                                   or len(self.running) <= self.spec_disable_batch_size)
        snapshot = list(self.running)
        running, max_model_len = RequestStatus.RUNNING, self.max_model_len
        manager, lookahead = self.kv_cache_manager, self.num_lookahead_tokens
        for index, request in enumerate(snapshot):
            if plan.budget <= 0:
                return
            if request.status is not running:  # preempted earlier in this loop
                continue
            placeholders, num_computed = request.num_output_placeholders, request.num_computed_tokens
            if placeholders and (request.needs_host_tokens or request.reaches_its_end_in_flight):
                continue  # async scheduling: wait for the token in flight (see the module docstring)
            # Without chunking a running request only ever lacks 1 token (its prompt ran whole), so the budget
            # cap only chunks where chunking is on (or a resumed request longer than the budget).
            num_new = min(len(request.all_token_ids) + placeholders - num_computed, plan.budget,
                          max_model_len - num_computed)  # (num_tokens without the property's call)
            if num_new <= 0:
                continue
            if num_new > 1:  # a prompt chunk: a hybrid model's may end on a block boundary (KVCacheManager)
                num_new = manager.aligned_chunk(num_computed, num_new)
            spec = []
            if request.spec_token_ids:
                if speculates:  # a token of the budget stays for each request after it
                    spec = self._spec_tokens(request, num_new, plan.budget - (len(snapshot) - index - 1))
                request.spec_token_ids = []  # consumed: the runner proposes afresh after this step
            if not spec and not lookahead:  # most steps: the slots are had without anybody preempted
                if manager.fits_unchanged(request, num_new):  # and without a new block (allocate_slots' [])
                    plan.add_running(request, num_new, [])
                    continue
                blocks = manager.allocate_slots(request, num_new)
                if blocks is not None:
                    plan.add_running(request, num_new, blocks)
                    continue
            allocated = self._allocate_or_preempt(request, num_new, plan, spec)
            if allocated is not None:  # else it gave way itself; those after it may still fit
                blocks, spec = allocated
                plan.add_running(request, num_new + len(spec), blocks, spec)

    def _spec_tokens(self, request: Request, num_new: int, budget: int) -> list[int]:
        """The proposals a decoding request verifies this step: as many as `budget` (the tokens it may take), the
        context and the request's remaining max_tokens leave room for, and its grammar allows. Each takes a
        logits row, which the runner's buckets always hold (worker/buckets.py's `max_step_rows`)."""
        if num_new != 1 or request.num_computed_tokens + 1 != request.num_tokens:
            return []  # not decoding (a prompt chunk, a recompute): proposals are stale
        room = min(budget - num_new, self.max_model_len - request.num_tokens - 1,
                   request.max_tokens - request.num_output_tokens - 1)
        spec = request.spec_token_ids[:max(room, 0)]
        if spec and request.grammar is not None:  # a proposal the grammar forbids can never be accepted
            spec = spec[:request.grammar.allowed_prefix(spec)]
        return spec

    def _allocate_or_preempt(self, request: Request, num_new: int, plan: StepPlan,
                             spec: list[int] | None = None) -> tuple[list[int], list[int]] | None:
        """The new block ids for `request`'s next `num_new` tokens and its proposals `spec`, and the proposals
        kept: they are dropped rather than preempting anybody for them. Otherwise the policy's victims are
        preempted one at a time until the tokens fit; None when `request` itself was the victim.

        Terminates: every failed try removes one request from `self.running`, and `request` is in it until
        it is chosen.
        """
        if spec:
            blocks = self._allocate(request, num_new + len(spec))
            if blocks is not None:
                return blocks, spec
        while (blocks := self._allocate(request, num_new)) is None:
            victim = self._pick_victim()
            self.running.remove(victim)
            plan.unschedule(victim)  # a victim planned earlier this step gives its tokens back
            self._preempt(victim)
            plan.preempted.append(victim)
            if victim is request:
                return None
        return blocks, []

    def _allocate(self, request: Request, num_new: int, num_hit: int = 0,
                  hit_blocks: list | None = None) -> list[int] | None:
        """New block ids for the tokens, with the lookahead slots when the pool has them (else without)."""
        manager = self.kv_cache_manager
        if self.num_lookahead_tokens:
            blocks = manager.allocate_slots(request, num_new, num_hit, hit_blocks, self.num_lookahead_tokens)
            if blocks is not None:
                return blocks
        return manager.allocate_slots(request, num_new, num_hit, hit_blocks)

    def _schedule_waiting(self, plan: StepPlan) -> None:
        """Admit waiting requests in policy order while the budget, max_num_seqs and the KV cache allow; the
        first that cannot be admitted ends admission (nobody skips the queue), except a request whose LoRA
        adapter has no slot: it waits, and those behind it go on."""
        blocked: set[str] = set()  # waiting for a LoRA slot this step
        while len(self.waiting) > len(blocked) and plan.budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = next_waiting(self.waiting, self.config.policy, blocked)
            lora = request.lora_request
            if lora is not None and not self.lora_slots.can_acquire(lora):
                blocked.add(request.request_id)
                continue
            if not self._admit(request, plan):
                return

    def _admit(self, request: Request, plan: StepPlan) -> bool:
        """Move one waiting request to running with its prefix-cache hit and this step's tokens, if they fit."""
        hit_blocks, num_hit = self.kv_cache_manager.get_computed_blocks(request)
        num_new = self._admission_chunk(request.num_tokens - num_hit, plan.budget)
        if num_new is None:
            return False
        num_new = self.kv_cache_manager.aligned_chunk(num_hit, num_new)
        if self._allocate(request, num_new, num_hit, hit_blocks) is None:
            return False
        self.waiting.remove(request)
        if request.lora_request is not None:
            request.lora_slot, load = self.lora_slots.acquire(request.lora_request)
            if load:
                plan.lora_loads[request.lora_slot] = request.lora_request
        if request.status == RequestStatus.PREEMPTED:
            request.num_output_tokens_at_resume = request.num_output_tokens
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_hit
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_hit
        plan.add_new(request, num_new)
        return True

    def _admission_chunk(self, num_uncomputed: int, budget: int) -> int | None:
        """How many of a newcomer's uncomputed tokens run this step; None: it must wait for a later step."""
        if num_uncomputed <= budget:
            return num_uncomputed
        # Without chunking a prompt runs whole, unless it could never fit whole (a resumed request whose
        # outputs pushed it past the budget): chunking it then beats starving.
        if not self.config.enable_chunked_prefill and num_uncomputed <= self.config.max_num_batched_tokens:
            return None
        return budget

    def _pick_victim(self) -> Request:
        return pick_victim(self.running, self.config.policy)  # a method: the anti-thrashing test watches it

    def _release_lora(self, request: Request) -> None:
        """Unpin the request's LoRA slot (it finished or was preempted); the adapter stays resident."""
        if request.lora_slot:
            self.lora_slots.release(request.lora_request)
            request.lora_slot = 0

    def _preempt(self, request: Request) -> None:
        """Preemption by recompute: free everything, restart from token 0 (prefix cache may help)."""
        if request.awaiting_progress:
            self.num_preemptions_without_progress += 1
        self.kv_cache_manager.free(request)  # before resetting num_computed_tokens (see free())
        self._release_lora(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(request)

    # ---- after the step ----------------------------------------------------------------------------

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Append sampled tokens, apply stop checks, free finished requests' blocks at once.

        Under async scheduling the next step has been scheduled already: a request preempted by it still gets
        its token (its recompute will include it), and one that finished meanwhile gets nothing."""
        req_ids = runner_output.req_ids
        # The runner's rows are the scheduled order unless it skipped some: then look each row up.
        row = None if req_ids == list(scheduler_output.num_scheduled_tokens) else {
            req_id: i for i, req_id in enumerate(req_ids)}
        starts = step_starts(scheduler_output) if runner_output.prompt_logprobs else {}
        outputs: list[EngineCoreOutput] = []
        scheduled = scheduler_output.scheduled_requests
        requests, max_model_len = self.requests, self.max_model_len
        sampled_rows, logprob_rows = runner_output.sampled_token_ids, runner_output.logprobs
        spec_tokens, prompt_chunks = scheduler_output.scheduled_spec_decode_tokens, runner_output.prompt_logprobs
        pooled, drafts = runner_output.pooler_output, runner_output.draft_token_ids
        rare = bool(spec_tokens or prompt_chunks or pooled)
        for index, req_id in enumerate(scheduler_output.num_scheduled_tokens):
            request = requests.get(req_id)
            i = index if row is None else row.get(req_id)
            if request is None or i is None:  # finished meanwhile (e.g. aborted), or the runner skipped it
                continue
            if scheduled and scheduled.get(req_id) is not request:  # ended, and its id taken by a new request
                continue
            sampled = sampled_rows[i]
            if sampled and request.num_output_placeholders:
                request.num_output_placeholders -= 1
            status = request.status
            was_running = status is RequestStatus.RUNNING
            prompt_logprobs = None
            if rare:  # proposals verified, prompts scored or pooled this step
                if spec_tokens and sampled and (spec := spec_tokens.get(req_id)):
                    self._roll_back_rejected(request, len(spec), len(sampled) - 1)
                chunk = prompt_chunks.get(req_id) if prompt_chunks else None
                if chunk is not None:
                    prompt_logprobs = new_prompt_logprobs(request, starts[req_id], chunk)
                if not sampled and prompt_logprobs is None:
                    continue
                if pooled and req_id in pooled:  # a pooled prompt ends "stop" and generates nothing (vLLM)
                    request.status = status = RequestStatus.FINISHED_STOPPED
            elif not sampled:
                continue
            if status.finish_reason is not None:  # (is_finished without the property's call)
                new_tokens: list[int] = []
            elif len(sampled) == 1:  # the common step: one token (inlined append_output_token_ids)
                new_tokens = sampled
                token = sampled[0]
                request.output_token_ids.append(token)
                request.all_token_ids.append(token)
                if not check_stop(request, max_model_len) and request.grammar is not None:
                    grammar_stops(request, token)
            else:
                new_tokens = []
                for token in sampled:
                    request.append_output_token_ids(token)
                    new_tokens.append(token)
                    if check_stop(request, max_model_len) or grammar_stops(request, token):
                        break
            logprobs = logprob_rows[i] if logprob_rows is not None else None
            finish_reason = request.status.finish_reason
            if finish_reason is None and (drafts or request.spec_token_ids):
                request.spec_token_ids = drafts.get(req_id, []) if drafts else []
            # positional: a third of the keywords' cost, per request per step
            outputs.append(EngineCoreOutput(req_id, new_tokens, finish_reason, request.stop_reason,
                                            logprobs[:len(new_tokens)] if logprobs is not None else None,
                                            prompt_logprobs, max(request.num_cached_tokens, 0)))
            if finish_reason is not None:
                (self.running if was_running else self.waiting).remove(request)
                self._free_request(request)
        return outputs

    def _roll_back_rejected(self, request: Request, num_spec: int, num_accepted: int) -> None:
        """Verified proposals: the rejected ones' positions were computed but hold the wrong tokens, so progress
        returns to the last accepted one (their KV slots stay allocated: the next step's tokens reuse them)."""
        self.spec_decode_counts.record(num_spec, num_accepted)
        if request.status == RequestStatus.RUNNING:
            request.num_computed_tokens -= num_spec - num_accepted

"""What a step's results mean for one request beyond its new tokens: its grammar (the next bitmask, advancing past a
sampled token) and which prompt logprobs are new. Pure Python, no jax; the scheduler calls these."""

from __future__ import annotations

import logging
from typing import Any

from vllm_jax.scheduler.output import SchedulerOutput
from vllm_jax.scheduler.request import Request, RequestStatus

logger = logging.getLogger(__name__)


def step_starts(sched: SchedulerOutput) -> dict[str, int]:
    """Each scheduled request's progress before the step (where its scored prompt positions begin)."""
    return ({new.req_id: new.num_computed_tokens for new in sched.scheduled_new_reqs}
            | dict(zip(sched.scheduled_cached_reqs.req_ids, sched.scheduled_cached_reqs.num_computed_tokens)))


def grammar_bitmasks(requests: list[Request], num_scheduled: dict[str, int],
                     spec_tokens: dict[str, list[int]]) -> dict[str, Any]:
    """The bitmask rows of each constrained request whose last scheduled token samples (a prompt chunk short of
    the prompt's end samples nothing, so it needs none): one per logits row, i.e. 1 + its proposals, row j masked
    as after proposals 0..j-1 (`RequestGrammar.bitmasks_along`). Read before progress advances."""
    masks: dict[str, Any] = {}
    for request in requests:
        if request.grammar is None:
            continue
        if request.num_computed_tokens + num_scheduled[request.request_id] < request.num_tokens:
            continue
        rows = request.grammar.bitmasks_along(spec_tokens.get(request.request_id, []))
        if rows is not None:
            masks[request.request_id] = rows
    return masks


def grammar_stops(request: Request, token: int) -> bool:
    """Advance a constrained request's grammar past `token` (called when the ordinary stop checks did not stop
    it). A complete grammar allows only EOS, which ends the request as in vLLM; with ignore_eos that EOS ends it
    here. A token the grammar rejects cannot come from a masked row: that request is aborted with an error
    logged, never continued unconstrained."""
    grammar = request.grammar
    if grammar is None:
        return False
    if not grammar.accept(token):
        logger.error("request %s: sampled token %d is not allowed by its structured-output grammar (%s); "
                     "aborting it", request.request_id, token, grammar.matcher.get_error())
        request.status = RequestStatus.FINISHED_ABORTED
        return True
    if grammar.is_terminated and token in grammar.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = None
        return True
    return False


PromptLogprobs = list[tuple[list[int], list[float], list[int]]]  # per position: ids, logprobs, ranks


def new_prompt_logprobs(request: Request, start: int, chunk: PromptLogprobs) -> PromptLogprobs | None:
    """The step's prompt logprobs for positions never reported before (None if none): the chunk scores the
    positions after the step's first token (`start`), and a recompute after a preemption starts again from 0."""
    new = chunk[max(0, request.num_prompt_logprobs_reported - start):]
    request.num_prompt_logprobs_reported = max(request.num_prompt_logprobs_reported, start + len(chunk))
    return new or None

"""Multi-step decoding's scheduling side: which steps may run K decode tokens per dispatch, and their K-ahead slots.

With `--num-scheduler-steps K` (vLLM's name), a step in which every scheduled request decodes one token and nothing
on the host must decide between its tokens becomes a chunk: the runner loops K times over forward -> sample -> KV
append on the device (multi_step/chunk.py). The scheduler gives each such request the KV slots for its chunk
up front, capped by its remaining max_tokens and the context, and never preempts for them: when the pool lacks
them the step stays a one-token step. Preemption, admission and finishing therefore happen only between chunks
(docs/architecture/05-worker.md, "Several decode steps per dispatch"). Pure Python, no jax.
"""

from __future__ import annotations

from vllm_jax.paged_kv.kv_cache_manager import KVCacheManager
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.scheduler.request import Request
from vllm_jax.scheduler.step_plan import StepPlan

MAX_DEVICE_STOP_IDS = 8  # stop ids a chunk's row checks on the device; a request with more runs one token a step


def device_stop_ids(params: SamplingParams) -> list[int]:
    """The token ids that end a request as `check_stop` decides it without min_tokens (which falls back): EOS and
    the generation config's extra ids unless ignore_eos (both in `all_stop_token_ids`), and stop_token_ids."""
    stops = set(params.stop_token_ids or [])
    if not params.ignore_eos:
        stops |= set(params.all_stop_token_ids or ())
    return sorted(stops)


def decodes_on_device(request: Request) -> bool:
    """Whether K tokens of this request may be sampled without the host seeing them in between.

    Falls back to one token per step: output-dependent sampling (penalties, bad words, min_tokens, a grammar:
    `needs_host_tokens`), stop strings (the output processor matches text), logit_bias / allowed_token_ids (the
    full sampler variant's [S, V] inputs), an adapter, and more stop ids than the device checks."""
    params = request.sampling_params
    if (request.needs_host_tokens or request.grammar is not None or params.stop or params.logit_bias
            or params.allowed_token_ids is not None or request.lora_request is not None):
        return False
    # the sum bounds the union: the set is built only for a request with many stop ids (this runs every step)
    num_ids = len(params.stop_token_ids or ()) + len(params.all_stop_token_ids or ())
    return num_ids <= MAX_DEVICE_STOP_IDS or len(device_stop_ids(params)) <= MAX_DEVICE_STOP_IDS


def chunk_limits(plan: StepPlan, num_steps: int, max_model_len: int, manager: KVCacheManager) -> dict[str, int] | None:
    """Turn a planned step into a chunk of up to `num_steps` decode tokens per request, allocating the slots.

    Returns each request's token limit in the chunk (min of K, its remaining max_tokens, the context), or None
    when the step must stay a one-token step: a newcomer or a preemption in it, a request not plainly decoding
    (a prompt chunk, a recompute, a token in flight), one that `decodes_on_device` refuses, a limit of 1 for
    everyone, or too few free blocks for the slots (nobody is preempted for them). Called before the step's
    progress advances: a decoding request has num_computed_tokens == num_tokens - 1."""
    if num_steps <= 1 or plan.new or plan.preempted or plan.spec_tokens or not plan.running:
        return None
    limits: dict[str, int] = {}
    needed = 0
    for request in plan.running:
        if (plan.num_scheduled[request.request_id] != 1 or request.num_output_placeholders
                or request.num_computed_tokens != request.num_tokens - 1 or not decodes_on_device(request)):
            return None
        limit = min(num_steps, request.max_tokens - request.num_output_tokens,
                    max_model_len - request.num_computed_tokens)
        limits[request.request_id] = max(limit, 1)
        total = manager.num_blocks_for(request.num_computed_tokens + limits[request.request_id])
        needed += max(0, total - len(manager.get_block_ids(request.request_id)))
    if max(limits.values()) <= 1 or needed > manager.num_free_blocks:
        return None
    for request in plan.running:
        limit = limits[request.request_id]
        if limit > 1:
            blocks = manager.allocate_slots(request, limit)
            if blocks is None:  # cannot happen after the count above; a one-token step is still correct
                raise RuntimeError(f"request {request.request_id}: chunk slots vanished")
            plan.new_block_ids[request.request_id] = plan.new_block_ids[request.request_id] + blocks
    return limits

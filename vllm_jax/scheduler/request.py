"""One generation request as the scheduler sees it: its tokens, progress and lifecycle status.

`num_computed_tokens` counts tokens whose KV is (or, within the current step, will be) in the cache;
the scheduler advances it when it schedules tokens, vLLM v1 style. Tokens are append-only, so the chained
block hashes computed for the prefix cache (`block_hashes`) stay valid for the request's whole life,
preemptions included.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_jax.lora.request import LoRARequest
from vllm_jax.paged_kv.block_hash import BlockHash
from vllm_jax.sampling_params import SamplingParams

if TYPE_CHECKING:
    from vllm_jax.structured_output import RequestGrammar


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


# `finish_reason`: vLLM's finish_reason string ("stop" / "length" / "abort"), None while unfinished. A plain
# attribute of each member, not a property: the scheduler reads it per request per step, and a property (or an
# Enum's hash, for a dict lookup) is a Python call.
for _status, _reason in ((RequestStatus.WAITING, None), (RequestStatus.RUNNING, None),
                         (RequestStatus.PREEMPTED, None), (RequestStatus.FINISHED_STOPPED, "stop"),
                         (RequestStatus.FINISHED_LENGTH_CAPPED, "length"), (RequestStatus.FINISHED_ABORTED, "abort")):
    _status.finish_reason = _reason


@dataclass(kw_only=True, eq=False)
class Request:
    """Keyword-only: the constructor has many ints and a misplaced positional one would be silent."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    seed: int  # sampling seed; the engine draws a random one at arrival when sampling_params.seed is None
    priority: int = 0  # lower value = scheduled earlier (vLLM's meaning) under the "priority" policy
    cache_salt: str | None = None
    # Resolves max_tokens=None to "up to the context length"; the scheduler fills it at add_request.
    max_model_len: int | None = None
    # The structured-output matcher (sampling_params.structured_outputs), advanced with every sampled token.
    grammar: RequestGrammar | None = None
    # Its next step's inputs need its latest token on the host (a grammar's bitmask, penalties' counts, bad words,
    # min_tokens), so the scheduler never schedules it while a token of it is still being sampled.
    needs_host_tokens: bool = False
    # The LoRA adapter it runs with (None: the base model); `lora_slot` is the device slot the scheduler pinned
    # for it while it runs (0: none).
    lora_request: LoRARequest | None = None
    lora_slot: int = field(default=0, init=False)
    # Its images (multimodal/inputs.py MultiModalInputs; None: text only): the runner encodes them, and their
    # hashes key the prefix cache's blocks that hold their tokens.
    mm_inputs: Any = None

    output_token_ids: list[int] = field(default_factory=list, init=False)
    num_computed_tokens: int = field(default=0, init=False)
    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    stop_reason: int | str | None = field(default=None, init=False)
    num_preemptions: int = field(default=0, init=False)
    num_cached_tokens: int = field(default=-1, init=False)  # prefix-cache hit at first scheduling; -1 before
    # Output tokens the request had when it was last resumed after a preemption (None: never resumed). Until it
    # samples one more, the scheduler avoids preempting it again (see scheduler/policy.py: pick_victim).
    num_output_tokens_at_resume: int | None = field(default=None, init=False)
    # Prompt positions scored so far (prompt_logprobs): a prefill recomputed after a preemption scores them again,
    # and only the ones past this count are new.
    num_prompt_logprobs_reported: int = field(default=0, init=False)
    # Tokens being sampled by a step in flight (async scheduling: 0 or 1), not in output_token_ids yet; the next
    # step already computes them (docs/architecture/02-engine.md, "Async scheduling").
    num_output_placeholders: int = field(default=0, init=False)
    # Speculative decoding: the tokens proposed for its next step (the runner's last proposal), verified there
    # together with its next token (docs/architecture/08-sampling.md, "Speculative decoding").
    spec_token_ids: list[int] = field(default_factory=list, init=False)
    block_hashes: list[BlockHash] = field(default_factory=list, init=False, repr=False)
    # Prompt then outputs: a public attribute, not a property, because the scheduler reads (and on the common
    # one-token step appends to) it per request per step. Others read it; only append_output_token_ids and the
    # scheduler's inlined copy of it append.
    all_token_ids: list[int] = field(default_factory=list, init=False, repr=False)
    # check_stop's pre-check (`_stop_filter`), built on first use: (length cap in tokens, the id that may stop it
    # or -1, whether every token needs the full check); depends only on params fixed at arrival.
    _stop_filter: tuple[int, int, bool] | None = field(default=None, init=False, repr=False)
    _length_cap: int | float | None = field(default=None, init=False, repr=False)  # `_cap()`, once asked

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def mm_spans(self) -> tuple[tuple[int, int, str], ...]:
        """(offset, length, hash) of each image's placeholder tokens: prefix-cache keys of the blocks holding them."""
        if self.mm_inputs is None:
            return ()
        return tuple((item.offset, item.length, item.hash) for item in self.mm_inputs.images)

    @property
    def lora_int_id(self) -> int:
        """The adapter's id, 0 without one (a prefix-cache key: docs/architecture/11-lora.md, "LoRA adapters")."""
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def max_tokens(self) -> int:
        if self.sampling_params.max_tokens is not None:
            return self.sampling_params.max_tokens
        if self.max_model_len is None:
            raise ValueError(f"request {self.request_id}: max_tokens is None and max_model_len is unknown")
        return self.max_model_len - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """Prompt logprobs need every prompt position's logits, so such a request computes its whole prompt
        (vLLM's rule)."""
        return self.sampling_params.prompt_logprobs is not None

    @property
    def awaiting_progress(self) -> bool:
        """Resumed after a preemption and not one new output token since: preempting it now would waste its
        recompute entirely (thrashing)."""
        return self.num_output_tokens_at_resume is not None and \
            self.num_output_tokens <= self.num_output_tokens_at_resume

    @property
    def reaches_its_end_in_flight(self) -> bool:
        """Its token in flight will be its last by length (max_tokens or the context), so nothing follows it."""
        placeholders = self.num_output_placeholders
        return placeholders > 0 and len(self.all_token_ids) + placeholders >= (self._length_cap or self._cap())

    def _cap(self) -> int | float:
        """The most tokens it may reach (prompt + max_tokens, at most the context): fixed at arrival, so kept."""
        context = self.max_model_len if self.max_model_len is not None else float("inf")
        self._length_cap = min(self.num_prompt_tokens + self.max_tokens, context)
        return self._length_cap

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)


def check_context_length(prompt_len: int, max_tokens: int | None, max_model_len: int) -> None:
    """Refuse a request that cannot fit the context, with vLLM's message (the server's 400 and the offline
    ValueError say the same). `max_tokens` None means "the rest of the context", so only the prompt counts."""
    if prompt_len >= max_model_len:
        raise ValueError(f"This model's maximum context length is {max_model_len} tokens. However, your request "
                         f"has {prompt_len} input tokens. Please reduce the length of the input.")
    if max_tokens is not None and prompt_len + max_tokens > max_model_len:
        raise ValueError(f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                         f"{prompt_len + max_tokens} tokens ({prompt_len} in the input, {max_tokens} in the "
                         f"completion). Please reduce the length of the input or of the completion (max_tokens).")


def _stop_filter(request: Request, max_model_len: int) -> tuple[int, int, bool]:
    cap = min(request._length_cap or request._cap(), max_model_len)  # a filter: a lower cap only checks more
    params = request.sampling_params
    eos = request.eos_token_id if not params.ignore_eos and request.eos_token_id is not None else -1
    request._stop_filter = (cap, eos, bool(params.stop_token_ids))
    return request._stop_filter


def check_stop(request: Request, max_model_len: int) -> bool:
    """Decide, after a token was appended, whether the request is done; sets status and stop_reason.

    vLLM v1's order: the length caps first (max_tokens, max_model_len), so a last token that is also EOS
    reports "length"; then min_tokens gates EOS (unless ignore_eos) and stop_token_ids (stop_reason = id).
    Stop strings are the output processor's job. Runs per request per step: a pre-check on plain ints returns
    False for the common token that can stop nothing.
    """
    cap, eos, stop_ids = request._stop_filter or _stop_filter(request, max_model_len)
    all_ids = request.all_token_ids
    if len(all_ids) < cap and not stop_ids and all_ids[-1] != eos:
        return False
    if request.num_output_tokens >= request.max_tokens or request.num_tokens >= max_model_len:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    params = request.sampling_params
    if request.num_output_tokens < params.min_tokens:
        return False
    last = request.output_token_ids[-1]
    if not params.ignore_eos and request.eos_token_id is not None and last == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = None
        return True
    if params.stop_token_ids and last in params.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last
        return True
    return False

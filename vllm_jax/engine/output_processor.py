"""OutputProcessor: the engine's last stage, turning per-step EngineCoreOutputs into RequestOutputs.

It owns what the scheduler does not know about: text. Per request it detokenizes new tokens, applies
stop strings (which end a request the scheduler still thinks is running, so their ids come back in
`ProcessedOutputs.reqs_to_abort`), builds logprob dicts, and shapes what the client sees by
`SamplingParams.output_kind`.

Decisions an engine integrator relies on:
- `n > 1`: the scheduler runs n child requests named by `child_request_ids` (`f"{i}_{request_id}"`);
  with n == 1 the only child is the request id itself. One RequestOutput per parent per
  `process_outputs` call aggregates the children (CompletionOutput.index = child number).
- CUMULATIVE carries all n completions so far; DELTA only the completions that changed, each with
  only its new text / token ids / logprobs; FINAL_ONLY one output once every child finished.
- While a request runs and has stop strings (not included in the output), text that could still be the
  start of a stop string is held back in CUMULATIVE and DELTA, so a client never sees text that a stop
  string later removes. Token ids are never held back and never truncated (as in vLLM).
- A core "stop" finish (EOS / stop token) does not detokenize that token unless
  include_stop_str_in_output. When a completion finishes, text held for an incomplete UTF-8 character is
  flushed (as U+FFFD, like a full decode of the tokens).
- Prompt logprobs start with None (position 0 has no logprob); chunks arriving over several steps are
  concatenated; with n > 1 they are taken from the first child that sends any. Outputs carrying only a
  prompt-logprob chunk produce no RequestOutput.
- `metrics`: arrival_time, first_token_time, last_token_time, finished_time (from `clock`).
- An aborted request's last output (`aborted_output`) follows the same output-kind rules: the client keeps what
  it was sent, and what did not finish ends with finish_reason "abort".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_jax.engine.detokenizer import IncrementalDetokenizer
from vllm_jax.outputs import CompletionOutput, Logprob, RequestOutput
from vllm_jax.sampling_params import RequestOutputKind, SamplingParams
from vllm_jax.scheduler.output import EngineCoreOutput

# (token_ids, logprobs, ranks): the sampled (or prompt) token first, then the top-N.
LogprobsEntry = tuple[list[int], list[float], list[int]]


def child_request_ids(request_id: str, n: int) -> list[str]:
    """The ids the scheduler runs for one request: itself when n == 1, else f"{i}_{request_id}"."""
    return [request_id] if n == 1 else [f"{i}_{request_id}" for i in range(n)]


@dataclass
class ProcessedOutputs:
    request_outputs: list[RequestOutput] = field(default_factory=list)
    # child ids a stop string ended: the engine must finish them in the scheduler (as stopped)
    reqs_to_abort: list[str] = field(default_factory=list)


class _Completion:
    """One child request: its text, tokens, logprobs and what has already been sent."""

    def __init__(self, index: int, req_id: str, detokenizer: IncrementalDetokenizer | None, logprobs: bool):
        self.index, self.req_id, self.detokenizer = index, req_id, detokenizer
        self.token_ids: list[int] = []
        self.text = ""
        self.logprobs: list[dict[int, Logprob]] | None = [] if logprobs else None
        self.cumulative_logprob: float | None = 0.0 if logprobs else None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.sent_text = self.sent_tokens = self.sent_logprobs = 0
        self.changed = False
        self.untexted = 0  # the last token ids whose text is not made yet (FINAL_ONLY: made at the end)


class _Request:
    """One user request (the parent of its n completions)."""

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, arrival_time: float, children: list[_Completion]):
        self.request_id, self.prompt, self.params = request_id, prompt, params
        self.prompt_token_ids = list(prompt_token_ids)
        self.children = children
        stop = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
        self.stops = [s for s in stop if s] if params.detokenize else []
        self.hold_back = bool(self.stops) and not params.include_stop_str_in_output
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = (
            [None] if params.prompt_logprobs is not None else None)
        self.prompt_logprobs_source: str | None = None
        self.sent_prompt_logprobs = 0
        self.num_cached_tokens: int | None = None
        self.metrics: dict[str, float] = {"arrival_time": arrival_time}
        self.sent_output = False  # a RequestOutput went out (a CUMULATIVE abort repeats it)
        # FINAL_ONLY: nothing goes out before a completion ends, so a step that ends none skips it
        self.final_only = params.output_kind == RequestOutputKind.FINAL_ONLY
        # No stop strings and no logprobs: a step that ends nothing only appends tokens and text (`_update`)
        self.plain = not self.stops and params.logprobs is None
        # ... and nobody reads the text before the end: it is made once, when a completion ends (`_update`)
        self.text_at_end = self.plain and self.final_only

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.children)


class OutputProcessor:
    """Holds every unfinished request's output state; see the module docstring for the contract."""

    def __init__(self, tokenizer: Any, clock: Callable[[], float] = time.time):
        self.tokenizer = tokenizer
        self._clock = clock
        self._requests: dict[str, _Request] = {}
        self._children: dict[str, tuple[_Request, _Completion]] = {}
        self._token_text: dict[int, str] = {}  # decoded_token cache, bounded by the vocabulary

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    sampling_params: SamplingParams, arrival_time: float,
                    child_ids: list[str] | None = None) -> None:
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already running")
        params = sampling_params
        child_ids = list(child_ids) if child_ids is not None else child_request_ids(request_id, params.n)
        if len(child_ids) != params.n:
            raise ValueError(f"expected {params.n} child ids for request {request_id!r}, got {len(child_ids)}")
        detok = params.detokenize and self.tokenizer is not None
        children = [
            _Completion(i, cid, IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                                       params.spaces_between_special_tokens) if detok else None,
                        params.logprobs is not None)
            for i, cid in enumerate(child_ids)]
        req = _Request(request_id, prompt, prompt_token_ids, params, arrival_time, children)
        self._requests[request_id] = req
        for child in children:
            self._children[child.req_id] = (req, child)

    def process_outputs(self, core_outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        result = ProcessedOutputs()
        touched: dict[str, _Request] = {}  # in order of first appearance
        now = self._clock()
        children = self._children
        for out in core_outputs:
            entry = children.get(out.req_id)
            if entry is None:
                continue  # finished or aborted already, or never added
            req, comp = entry
            detokenizer = comp.detokenizer
            if req.plain and detokenizer is not None and out.finish_reason is None and \
                    req.num_cached_tokens is not None and not out.new_prompt_logprobs:
                # Most steps: what the general path below does for them, without its checks (no stop strings
                # or logprobs, nothing ends; a finished completion has no detokenizer).
                new_ids = out.new_token_ids
                if new_ids:
                    comp.token_ids.extend(new_ids)
                    comp.changed = True
                    if req.text_at_end:
                        comp.untexted += len(new_ids)
                    else:
                        comp.text += detokenizer.push_list(new_ids)
                        if not req.final_only:
                            touched[req.request_id] = req
                    metrics = req.metrics
                    if "first_token_time" not in metrics:
                        metrics["first_token_time"] = now
                    metrics["last_token_time"] = now
                continue
            if req.num_cached_tokens is None:
                req.num_cached_tokens = out.num_cached_tokens
            if out.new_prompt_logprobs:
                self._add_prompt_logprobs(req, out.req_id, out.new_prompt_logprobs)
            if comp.finish_reason is not None:
                continue  # a stop string ended it; the scheduler has not dropped it yet
            if self._update(req, comp, out):
                result.reqs_to_abort.append(comp.req_id)
            if comp.changed:
                if not req.final_only or comp.finish_reason is not None:
                    touched[req.request_id] = req
                if out.new_token_ids:
                    metrics = req.metrics
                    if "first_token_time" not in metrics:
                        metrics["first_token_time"] = now
                    metrics["last_token_time"] = now
        for req in touched.values():
            finished = req.finished
            if finished:
                req.metrics["finished_time"] = now
            request_output = self._make_output(req, finished)
            if request_output is not None:
                result.request_outputs.append(request_output)
            if finished:
                self._drop(req)
        return result

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Drop the requests (parent or child ids); return the child ids the scheduler must abort."""
        to_abort: list[str] = []
        for rid in request_ids:
            req = self._requests.get(rid)
            if req is None and rid in self._children:
                req = self._children[rid][0]
            if req is None:
                continue
            to_abort.extend(c.req_id for c in req.children if c.finish_reason is None)
            self._drop(req)
        return to_abort

    def aborted_output(self, request_id: str) -> RequestOutput | None:
        """The final output of a running request that is being aborted (None: `request_id` is no running parent).

        Completions that did not finish end with finish_reason "abort"; the client keeps what it was sent.
        CUMULATIVE repeats its last output. Otherwise every completion whose end the client has not seen comes
        empty: DELTA the unfinished ones; FINAL_ONLY (and CUMULATIVE before its first output), which sent
        nothing, all of them. Call it before `abort_requests` drops the request.
        """
        req = self._requests.get(request_id)
        if req is None:
            return None
        kind = req.params.output_kind
        if kind == RequestOutputKind.CUMULATIVE and req.sent_output:
            outputs = [_as_sent(c) for c in req.children]
        else:
            outputs = [CompletionOutput(c.index, "", [], None, None, "abort") for c in req.children
                       if kind != RequestOutputKind.DELTA or c.finish_reason is None]
        return RequestOutput(
            request_id=req.request_id, prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
            prompt_logprobs=None, outputs=outputs, finished=True, num_cached_tokens=req.num_cached_tokens or 0,
            metrics=dict(req.metrics))

    def num_prompt_tokens(self, request_id: str) -> int:
        return len(self._requests[request_id].prompt_token_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

    # -- internals --------------------------------------------------------------------------------

    def _drop(self, req: _Request) -> None:
        self._requests.pop(req.request_id, None)
        for child in req.children:
            self._children.pop(child.req_id, None)

    def _update(self, req: _Request, comp: _Completion, out: EngineCoreOutput) -> bool:
        """Fold one core output into a completion; True when a stop string ended it here (process_outputs folds
        the common step, no stop strings, logprobs or end, itself)."""
        params = req.params
        new_ids = out.new_token_ids  # read only
        comp.token_ids.extend(new_ids)
        comp.changed = comp.changed or bool(new_ids) or out.finish_reason is not None
        if comp.logprobs is not None and out.new_logprobs:
            for entry in out.new_logprobs:
                comp.logprobs.append(self._logprob_dict(entry, params.logprobs, params.detokenize))
                comp.cumulative_logprob += float(entry[1][0])
        finish, stop_reason = out.finish_reason, out.stop_reason
        hit_stop_string = False
        if comp.detokenizer is not None and req.text_at_end and finish is None:
            comp.untexted += len(new_ids)  # nobody reads it before the end
        elif comp.detokenizer is not None:
            ids = new_ids
            if comp.untexted:  # the tokens whose text was left for the end come first
                ids = comp.token_ids[-(len(new_ids) + comp.untexted):]
                comp.untexted = 0
            if finish == "stop" and new_ids and not params.include_stop_str_in_output:
                ids = ids[:-1]  # the stop token's own text is not part of the output
            old_len = len(comp.text)
            if finish is not None:
                new_text = comp.detokenizer.finish(ids)
            else:
                new_text = comp.detokenizer.push(ids)
            comp.text += new_text
            if req.stops and new_text and len(comp.token_ids) > params.min_tokens:
                hit = _find_stop_string(comp.text, old_len, req.stops)
                if hit is not None:
                    pos, stop = hit
                    comp.text = comp.text[:pos + len(stop) if params.include_stop_str_in_output else pos]
                    hit_stop_string = finish is None  # else the scheduler finished it already
                    finish, stop_reason = "stop", stop
                    comp.changed = True
        if finish is not None:
            comp.finish_reason, comp.stop_reason, comp.detokenizer = finish, stop_reason, None
        return hit_stop_string

    def _make_output(self, req: _Request, finished: bool) -> RequestOutput | None:
        kind = req.params.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        delta = kind == RequestOutputKind.DELTA
        outputs = [self._completion_output(req, c, delta) for c in req.children if c.changed or not delta]
        for c in req.children:
            c.changed = False
        prompt_logprobs = req.prompt_logprobs
        if prompt_logprobs is not None:
            if delta:
                prompt_logprobs = prompt_logprobs[req.sent_prompt_logprobs:] or None
                req.sent_prompt_logprobs = len(req.prompt_logprobs)
            else:
                prompt_logprobs = list(prompt_logprobs)
        req.sent_output = True
        return RequestOutput(
            request_id=req.request_id, prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
            prompt_logprobs=prompt_logprobs, outputs=outputs, finished=finished,
            num_cached_tokens=req.num_cached_tokens or 0, metrics=dict(req.metrics))

    @staticmethod
    def _completion_output(req: _Request, c: _Completion, delta: bool) -> CompletionOutput:
        end = len(c.text)
        if c.finish_reason is None and req.hold_back:
            end -= _held_back(c.text, req.stops)
        end = max(end, c.sent_text)
        if delta:
            text, token_ids = c.text[c.sent_text:end], c.token_ids[c.sent_tokens:]
            logprobs = c.logprobs[c.sent_logprobs:] if c.logprobs is not None else None
        else:
            text, token_ids = c.text[:end], list(c.token_ids)
            logprobs = list(c.logprobs) if c.logprobs is not None else None
        c.sent_text, c.sent_tokens = end, len(c.token_ids)
        c.sent_logprobs = len(c.logprobs) if c.logprobs is not None else 0
        return CompletionOutput(index=c.index, text=text, token_ids=token_ids,
                                cumulative_logprob=c.cumulative_logprob, logprobs=logprobs,
                                finish_reason=c.finish_reason, stop_reason=c.stop_reason)

    def _add_prompt_logprobs(self, req: _Request, child_id: str, chunk: list[LogprobsEntry]) -> None:
        if req.prompt_logprobs is None:
            return
        if req.prompt_logprobs_source is None:
            req.prompt_logprobs_source = child_id
        if child_id != req.prompt_logprobs_source:
            return  # every child computes the same prompt; keep one copy
        # at most one entry per prompt position (a recomputed prompt must not add positions twice)
        for entry in chunk[:max(0, len(req.prompt_token_ids) - len(req.prompt_logprobs))]:
            req.prompt_logprobs.append(
                self._logprob_dict(entry, req.params.prompt_logprobs, req.params.detokenize))

    def _logprob_dict(self, entry: LogprobsEntry, num: int | None, decode: bool) -> dict[int, Logprob]:
        """The token first, then its top-`num`: num + 1 entries, or num when the token is among them."""
        token_ids, logprobs, ranks = entry
        limit = len(token_ids) if num is None else num + 1
        result: dict[int, Logprob] = {}
        for token_id, logprob, rank in zip(token_ids[:limit], logprobs[:limit], ranks[:limit]):
            token_id = int(token_id)
            if token_id not in result:
                text = self._decode_token(token_id) if decode else None
                result[token_id] = Logprob(logprob=float(logprob), rank=int(rank), decoded_token=text)
        return result

    def _decode_token(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id]) or ""
            self._token_text[token_id] = text
        return text


def _as_sent(c: _Completion) -> CompletionOutput:
    """A completion as the client last received it in full, ending with "abort" unless it finished."""
    logprobs = c.logprobs[:c.sent_logprobs] if c.logprobs is not None else None
    return CompletionOutput(index=c.index, text=c.text[:c.sent_text], token_ids=c.token_ids[:c.sent_tokens],
                            cumulative_logprob=c.cumulative_logprob, logprobs=logprobs,
                            finish_reason=c.finish_reason or "abort", stop_reason=c.stop_reason)


def _find_stop_string(text: str, old_len: int, stops: list[str]) -> tuple[int, str] | None:
    """The earliest stop string that ends in the text added after `old_len`, as (position, string)."""
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop, max(0, old_len - len(stop) + 1))
        if pos != -1 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    longest = max(len(s) for s in stops)
    for k in range(min(longest - 1, len(text)), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stops):
            return k
    return 0

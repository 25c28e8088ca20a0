"""/v1/completions: each prompt of the list is one engine request (n completions each), run concurrently.

Choice indices follow OpenAI: prompt i, completion j -> index i * n + j. Usage counts each prompt's tokens once
and every completion's tokens.

`echo` prepends the prompt to each choice: its text, and with `logprobs` its tokens scored by the engine's
prompt logprobs (the first token null), then the completion's tokens, in one legacy logprobs list whose
`text_offset`s index the choice's whole text. That is how lm-eval's `local-completions` scores a continuation.
With `max_tokens: 0` the choice is the prompt alone (the one token generated for it is dropped; usage still
counts it, as vLLM's does). A stream sends the echo with a choice's first chunk, holding that choice back until
its prompt's scores are all in (with n > 1 another completion may have computed them); later chunks' offsets
continue after the echo (vLLM's stream restarts them without it; its non-streamed offsets include it, as ours do).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vllm_jax.outputs import CompletionOutput, PromptLogprobs, RequestOutput
from vllm_jax.server.engine_streams import RequestStreams, await_or_disconnect, engine_error, start_or_abort
from vllm_jax.server.errors import APIError, bad_request
from vllm_jax.server.logprobs import completion_logprobs, prompt_logprobs
from vllm_jax.server.protocol import CompletionRequest
from vllm_jax.server.responses import CompletionChoice, CompletionChunk, CompletionResponse, UsageInfo
from vllm_jax.server.serving import ServingContext
from vllm_jax.server.sse import SSE_DONE, SSEResponse, sse_event, stream_error_event


async def create_completion(ctx: ServingContext, body: CompletionRequest, raw: Request) -> Response:
    model = ctx.admit(body)
    try:
        prompts = body.prompts()
    except ValueError as exc:
        raise bad_request(str(exc), param="prompt") from exc
    texts: list[str | None] = []
    token_ids: list[list[int]] = []
    for p in prompts:
        if isinstance(p, str):
            texts.append(p)
            token_ids.append(await ctx.tokenize(p))
        else:
            texts.append(None)
            token_ids.append(ctx.check_token_ids(p, "prompt"))
    params = [ctx.sampling_params(body, len(ids), "prompt") for ids in token_ids]
    for p in params:
        await ctx.compile_structured_outputs(body, p)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    engine_ids = [request_id] if len(prompts) == 1 else [f"{request_id}-{i}" for i in range(len(prompts))]
    for rid, text, ids, p in zip(engine_ids, texts, token_ids, params):
        ctx.log_request(rid, text if text is not None else ids, p)
    echoes = [(t if t is not None else ctx.detokenize(ids)) if body.echo else "" for t, ids in zip(texts, token_ids)]

    streams = RequestStreams(ctx.engine, token_ids, params, engine_ids, priority=body.priority,
                             cache_salt=body.cache_salt, lora_request=ctx.lora_request(body.model))
    if body.stream:
        await start_or_abort(streams, raw)
        return SSEResponse(_stream(ctx, body, streams, request_id, model, echoes), on_close=streams.close)
    try:
        finals = await await_or_disconnect(_collect(streams, len(prompts)), raw)
    finally:
        await streams.close()
    return JSONResponse(_response(ctx, body, finals, request_id, model, echoes).model_dump())


async def _collect(streams: RequestStreams, count: int) -> list[RequestOutput]:
    await streams.start()
    finals: list[RequestOutput | None] = [None] * count
    try:
        async for i, out in streams:
            finals[i] = out
    except Exception as exc:
        mapped = engine_error(exc, starting=False)
        if mapped is not None:
            raise mapped from exc
        raise
    if any(f is None or not f.finished for f in finals):
        raise APIError(500, "The engine ended a request without a final output.", code="internal_error")
    return finals  # type: ignore[return-value]


@dataclass
class _Echo:
    """What an echo prepends to a choice: the prompt's text and tokens, and their scores when logprobs are asked."""

    text: str
    token_ids: list[int]
    logprobs: PromptLogprobs

    @classmethod
    def of(cls, text: str, token_ids: list[int], scores: PromptLogprobs | None) -> _Echo:
        """Positions the engine did not score (an aborted request's) get null logprobs."""
        scores = list(scores or [])
        return cls(text, token_ids, scores + [None] * (len(token_ids) - len(scores)))


def _choice(ctx: ServingContext, body: CompletionRequest, index: int, out: CompletionOutput, echo: _Echo | None,
            offset: int) -> tuple[CompletionChoice, int]:
    generated = not body.echo_without_generation
    text = out.text if generated else ""
    token_ids = list(out.token_ids) if generated else []
    steps: PromptLogprobs = list(out.logprobs or [None] * len(token_ids)) if generated else []
    if echo is not None:
        text, token_ids, steps = echo.text + text, echo.token_ids + token_ids, echo.logprobs + steps
    logprobs = None
    if body.logprobs is not None:
        logprobs, offset = completion_logprobs(token_ids, steps, body.logprobs, ctx.engine.tokenizer, offset)
    return CompletionChoice(index=index, text=text, logprobs=logprobs,
                            finish_reason=out.finish_reason, stop_reason=out.stop_reason), offset


def _merge(outs: list[CompletionOutput]) -> CompletionOutput:
    """Consecutive deltas of one completion as one delta."""
    last = outs[-1]
    logprobs = None if all(o.logprobs is None for o in outs) else [lp for o in outs for lp in o.logprobs or []]
    return CompletionOutput(index=last.index, text="".join(o.text for o in outs),
                            token_ids=[t for o in outs for t in o.token_ids],
                            cumulative_logprob=last.cumulative_logprob, logprobs=logprobs,
                            finish_reason=last.finish_reason, stop_reason=last.stop_reason)


def _response(ctx: ServingContext, body: CompletionRequest, finals: list[RequestOutput], request_id: str,
              model: str, echoes: list[str]) -> CompletionResponse:
    choices: list[CompletionChoice] = []
    usage = UsageInfo()
    for i, final in enumerate(finals):
        usage.prompt_tokens += len(final.prompt_token_ids)
        for out in sorted(final.outputs, key=lambda o: o.index):
            usage.completion_tokens += len(out.token_ids)
            echo = _Echo.of(echoes[i], final.prompt_token_ids, final.prompt_logprobs) if body.echo else None
            choice = _choice(ctx, body, i * body.n + out.index, out, echo, 0)[0]
            choice.prompt_logprobs = prompt_logprobs(final.prompt_logprobs)
            choices.append(choice)
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
    return CompletionResponse(id=request_id, model=model, choices=choices, usage=usage)


async def _stream(ctx: ServingContext, body: CompletionRequest, streams: RequestStreams, request_id: str,
                  model: str, echoes: list[str]) -> AsyncIterator[str]:
    created = int(time.time())
    num_choices = len(echoes) * body.n
    offsets = [0] * num_choices
    echoed = [not body.echo] * num_choices
    scored = body.echo and body.logprobs is not None
    scores: dict[int, PromptLogprobs] = {}  # prompt -> its prompt logprobs so far (they arrive in deltas)
    held: dict[int, list[CompletionOutput]] = {}  # choice -> deltas not sent yet
    prompt_tokens: dict[int, int] = {}
    completion_tokens = 0
    try:
        async for i, output in streams:
            prompt_tokens[i] = len(output.prompt_token_ids)
            scores.setdefault(i, []).extend(output.prompt_logprobs or [])
            complete = not scored or len(scores[i]) >= len(output.prompt_token_ids)
            for out in output.outputs:
                completion_tokens += len(out.token_ids)
                held.setdefault(i * body.n + out.index, []).append(out)
            for index in [k for k in held if k // body.n == i]:
                out = _merge(held[index])
                if not (echoed[index] or complete or out.finished()):
                    continue  # its echo waits for the prompt's scores
                del held[index]
                echo = None
                if not echoed[index]:
                    echo, echoed[index] = _Echo.of(echoes[i], output.prompt_token_ids, scores[i]), True
                choice, offsets[index] = _choice(ctx, body, index, out, echo, offsets[index])
                if not choice.text and choice.finish_reason is None and choice.logprobs is None:
                    continue
                yield sse_event(CompletionChunk(id=request_id, created=created, model=model, choices=[choice]))
        if body.include_usage:
            prompt = sum(prompt_tokens.values())
            usage = UsageInfo(prompt_tokens=prompt, completion_tokens=completion_tokens,
                              total_tokens=prompt + completion_tokens)
            yield sse_event(CompletionChunk(id=request_id, created=created, model=model, choices=[], usage=usage))
    except Exception as exc:  # noqa: BLE001 - the status line is sent: report in-band, as vLLM does
        yield stream_error_event(exc, request_id)
    finally:
        await streams.close()
    yield SSE_DONE

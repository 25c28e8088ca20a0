"""/v1/chat/completions: the conversation (and tools) rendered by the chat template, one engine request with n
completions, each read into reasoning, content and tool calls by chat_output.py.

Streaming follows OpenAI's chunk sequence: first a `{"role": "assistant", "content": ""}` delta per choice,
then deltas of content, reasoning and tool calls (the last one of a choice carries its finish_reason), then an
optional usage chunk with no choices (`stream_options.include_usage`), then `data: [DONE]`.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vllm_jax.outputs import CompletionOutput, RequestOutput
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.server.chat_images import engine_prompt, load_chat_images
from vllm_jax.server.chat_messages import chat_conversation_and_images
from vllm_jax.server.chat_output import ChatOutputRules, ChoiceStreamer
from vllm_jax.server.engine_streams import RequestStreams, await_or_disconnect, engine_error, start_or_abort
from vllm_jax.server.errors import APIError, bad_request
from vllm_jax.server.logprobs import chat_logprobs, prompt_logprobs
from vllm_jax.server.protocol import ChatCompletionRequest
from vllm_jax.server.responses import (
    ChatChoiceLogprobs,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatStreamChoice,
    DeltaMessage,
    UsageInfo,
)
from vllm_jax.server.serving import ServingContext
from vllm_jax.server.sse import SSE_DONE, SSEResponse, sse_event, stream_error_event
from vllm_jax.server.tool_choice import AUTO_NEEDS_FLAGS


@dataclasses.dataclass(frozen=True)
class PreparedChat:
    """A chat request made ready for the engine: what /v1/chat/completions and /v1/responses share."""

    model: str
    conversation: list[dict[str, Any]]
    prompt_ids: list[int]
    params: SamplingParams
    rules: ChatOutputRules
    images: tuple[Any, ...] = ()  # RGB PIL images, one per placeholder the template wrote, in order

    @property
    def engine_prompt(self) -> list[int] | dict[str, Any]:
        return engine_prompt(self.prompt_ids, list(self.images))


async def prepare_chat(ctx: ServingContext, body: ChatCompletionRequest) -> PreparedChat:
    """Check `body`, render its conversation with the chat template and build its sampling params and output
    rules (APIError on bad input)."""
    model = ctx.admit(body)
    if body.resolved_tool_choice().mode == "auto" and ctx.tool_parser is None:
        raise bad_request(AUTO_NEEDS_FLAGS, param="tool_choice")
    try:
        conversation, image_sources = chat_conversation_and_images(body.messages)
    except ValueError as exc:
        raise bad_request(str(exc), param=getattr(exc, "param", None) or "messages") from exc
    images = await load_chat_images(ctx, image_sources, model)
    prompt_ids = await ctx.chat_prompt_ids(conversation, add_generation_prompt=body.add_generation_prompt,
                                           continue_final_message=body.continue_final_message,
                                           template_kwargs=body.chat_template_kwargs, tools=body.template_tools())
    params = ctx.sampling_params(body, len(prompt_ids), "messages")
    if images and body.max_completion_tokens is None and body.max_tokens is None:
        # the rest of the context, counted by the engine once it expanded each image's placeholder
        params = dataclasses.replace(params, max_tokens=None)
    rules = ChatOutputRules.for_request(body, ctx.tool_parser, ctx.reasoning_parser,
                                        constrained=params.structured_outputs is not None)
    if rules.keeps_special_tokens:
        params = dataclasses.replace(params, skip_special_tokens=False)
    await ctx.compile_structured_outputs(body, params)
    return PreparedChat(model, conversation, prompt_ids, params, rules, tuple(images))


async def create_chat_completion(ctx: ServingContext, body: ChatCompletionRequest, raw: Request) -> Response:
    chat = await prepare_chat(ctx, body)
    model, rules, params = chat.model, chat.rules, chat.params
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    ctx.log_request(request_id, chat.conversation, params)
    streams = RequestStreams(ctx.engine, [chat.engine_prompt], [params], [request_id], priority=body.priority,
                             cache_salt=body.cache_salt, lora_request=ctx.lora_request(body.model))
    if body.stream:
        await start_or_abort(streams, raw)
        return SSEResponse(_stream(ctx, body, rules, streams, request_id, model), on_close=streams.close)
    try:
        final = await await_or_disconnect(final_output(streams), raw)
    finally:
        await streams.close()
    return JSONResponse(_response(ctx, body, rules, final, request_id, model).model_dump())


async def final_output(streams: RequestStreams) -> RequestOutput:
    await streams.start()
    final = None
    try:
        async for _, out in streams:
            final = out
    except Exception as exc:
        mapped = engine_error(exc, starting=False)
        if mapped is not None:
            raise mapped from exc
        raise
    if final is None or not final.finished:
        raise APIError(500, "The engine ended a request without a final output.", code="internal_error")
    return final


def _logprobs(ctx: ServingContext, body: ChatCompletionRequest, out: CompletionOutput) -> ChatChoiceLogprobs | None:
    if not body.logprobs or out.logprobs is None:
        return None
    content = chat_logprobs(out.token_ids, out.logprobs, body.top_logprobs or 0, ctx.engine.tokenizer)
    return ChatChoiceLogprobs(content=content)


def _response(ctx: ServingContext, body: ChatCompletionRequest, rules: ChatOutputRules, final: RequestOutput,
              request_id: str, model: str) -> ChatCompletionResponse:
    choices = []
    for out in sorted(final.outputs, key=lambda o: o.index):
        message, finish_reason = rules.message(out.text, out.finish_reason)
        choices.append(ChatCompletionChoice(index=out.index, message=message, logprobs=_logprobs(ctx, body, out),
                                            finish_reason=finish_reason, stop_reason=out.stop_reason))
    prompt = len(final.prompt_token_ids)
    completion = sum(len(out.token_ids) for out in final.outputs)
    usage = UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    return ChatCompletionResponse(id=request_id, model=model, choices=choices, usage=usage,
                                  prompt_logprobs=prompt_logprobs(final.prompt_logprobs))


async def _stream(ctx: ServingContext, body: ChatCompletionRequest, rules: ChatOutputRules, streams: RequestStreams,
                  request_id: str, model: str) -> AsyncIterator[str]:
    created = int(time.time())
    choice_streams: list[ChoiceStreamer] = [rules.streamer() for _ in range(body.n)]

    def chunk(choices: list[ChatStreamChoice], usage: UsageInfo | None = None) -> str:
        return sse_event(ChatCompletionChunk(id=request_id, created=created, model=model, choices=choices,
                                             usage=usage))

    prompt_tokens = completion_tokens = 0
    try:
        yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                     for i in range(body.n)])
        async for _, output in streams:
            prompt_tokens = len(output.prompt_token_ids)
            for out in output.outputs:
                completion_tokens += len(out.token_ids)
                logprobs = _logprobs(ctx, body, out)
                choice = choice_streams[out.index]
                delta = choice.push(out.text, finished=out.finish_reason is not None)
                if delta == DeltaMessage() and out.finish_reason is None and not (logprobs and logprobs.content):
                    continue
                yield chunk([ChatStreamChoice(
                    index=out.index, delta=delta, logprobs=logprobs, stop_reason=out.stop_reason,
                    finish_reason=rules.finish_reason(choice.calls_sent > 0, out.finish_reason))])
        if body.include_usage:
            yield chunk([], UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                      total_tokens=prompt_tokens + completion_tokens))
    except Exception as exc:  # noqa: BLE001 - the status line is sent: report in-band, as vLLM does
        yield stream_error_event(exc, request_id)
    finally:
        await streams.close()
    yield SSE_DONE

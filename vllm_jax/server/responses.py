"""OpenAI's response shapes (completions, chat completions and their stream chunks, models, tokenize, errors) as
pydantic models, and the OpenAPI entry of a route that answers JSON or server-sent events. The request shapes
and their checks are in protocol.py.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer, model_validator

from vllm_jax.server.openai_base import OpenAIBaseModel


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(OpenAIBaseModel):
    """vLLM's prompt_logprobs entry (per position: token id -> this), None at position 0."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(OpenAIBaseModel):
    content: list[ChatLogprob] | None = None


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(OpenAIBaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class _WithReasoning(OpenAIBaseModel):
    """--reasoning-parser's thinking, apart from the answer: `reasoning` (current vLLM's field) and the same text
    as `reasoning_content` (its earlier name, which DeepSeek's API and many clients still read)."""

    reasoning: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="after")
    def _both_names(self) -> _WithReasoning:
        if self.reasoning_content is None:
            self.reasoning_content = self.reasoning
        return self


class AssistantMessage(_WithReasoning):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatCompletionChoice(OpenAIBaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None


class _Delta(OpenAIBaseModel):
    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        """A delta carries only what changed: `{"content": "..."}`, never `"role": null`."""
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaFunctionCall(_Delta):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Delta):
    """A piece of a streamed tool call: the first piece of call `index` has its id, type and name; the client
    appends the `arguments` of every piece."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class DeltaMessage(_Delta, _WithReasoning):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class CompletionChunk(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm-jax"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# One server-sent event: its `data` is a chunk (the response's JSON shape, with deltas) or `[DONE]`.
_SSE_EVENT = {"type": "object", "required": ["data"],
              "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}


def json_or_sse(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entry of a generation route: `model` as JSON, or an SSE stream when stream=true."""
    return {200: {"model": model, "description": "The completion (JSON), or with stream=true its chunks as "
                  "server-sent events ending with `data: [DONE]`.",
                  "content": {"text/event-stream": {"schema": _SSE_EVENT}}}}

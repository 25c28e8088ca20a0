"""OpenAI's Responses API shapes (`/v1/responses`): the request, its translation into a chat completions request,
and the response object and its output items.

A Responses request is served by the chat pipeline (docs/architecture/01-overview.md, "The Responses API"):
`to_chat_request` turns its input items, instructions, tools, tool_choice and text.format into the
`ChatCompletionRequest` that /v1/chat/completions would get for the same conversation, so the chat template, the
tool-choice grammar, the tool parsers and the reasoning parsers are the same code. What the chat path cannot
honor (hosted tools, background mode, images) is a 400 naming the field, never silently dropped.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field, ValidationError

from vllm_jax.server.openai_base import OpenAIBaseModel, OpenAIRequestModel
from vllm_jax.server.protocol import ChatCompletionRequest

_INT32_MAX = 2**31 - 1
# `include` entries that ask for nothing this server would send: accepted (the openai-agents SDK sends the first).
_IGNORABLE_INCLUDES = frozenset({"reasoning.encrypted_content"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
# the chat request's fields, by the Responses field they come from (for errors)
_CHAT_FIELDS = {"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text.format"}


class ResponsesInputError(ValueError):
    """Bad Responses input, with the field to name as OpenAI's `param`."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class ResponsesRequest(OpenAIRequestModel):
    """OpenAI's request body; fields the chat path has no use for are refused in `check_unsupported`."""

    model: str | None = None
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, le=_INT32_MAX)
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    stream: bool = False
    # refused when set (check_unsupported)
    background: bool | None = None
    include: list[str] | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    truncation: str | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    # vLLM extras, as on chat
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    priority: int = 0
    cache_salt: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def check_unsupported(self) -> None:
        """ResponsesInputError (a 400 naming the field) for what this server cannot do."""
        if self.background:
            raise ResponsesInputError("background is not supported; send the request without it (stream=true "
                                      "gives the output as it is made).", "background")
        if self.conversation is not None:
            raise ResponsesInputError("conversation is not supported; continue with previous_response_id.",
                                      "conversation")
        if self.prompt is not None:
            raise ResponsesInputError("prompt (a stored prompt template) is not supported; send input and "
                                      "instructions.", "prompt")
        if self.truncation not in (None, "disabled"):
            raise ResponsesInputError(f"truncation {self.truncation!r} is not supported (only \"disabled\").",
                                      "truncation")
        if self.max_tool_calls is not None:
            raise ResponsesInputError("max_tool_calls is not supported.", "max_tool_calls")
        if self.top_logprobs:
            raise ResponsesInputError("top_logprobs is not supported on /v1/responses; use /v1/chat/completions.",
                                      "top_logprobs")
        for entry in self.include or []:
            if entry not in _IGNORABLE_INCLUDES:
                raise ResponsesInputError(f"include {entry!r} is not supported.", "include")
        for i, tool in enumerate(self.tools or []):
            if tool.get("type") != "function":
                raise ResponsesInputError(f"tools[{i}]: tools of type {tool.get('type')!r} (hosted tools) are not "
                                          "supported; only function tools.", "tools")

    # ---- the chat request ----
    def input_items(self) -> list[dict[str, Any]]:
        """`input` as a list of items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}] if self.input else []
        return list(self.input)

    def to_chat_request(self, history: list[dict[str, Any]]) -> ChatCompletionRequest:
        """The chat completions request for `history` (the items of earlier turns, from previous_response_id)
        followed by this request's input, with this request's instructions first."""
        self.check_unsupported()
        messages = items_to_messages(history + self.input_items())
        if self.instructions:
            messages.insert(0, {"role": "system", "content": self.instructions})
        if not messages:
            raise ResponsesInputError("input must not be empty.", "input")
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature, "top_p": self.top_p, "parallel_tool_calls": self.parallel_tool_calls,
            "stream": self.stream, "user": self.user, "seed": self.seed, "top_k": self.top_k, "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty, "priority": self.priority, "cache_salt": self.cache_salt,
            "chat_template_kwargs": self._template_kwargs()}
        if self.tools:
            body["tools"] = [_chat_tool(tool) for tool in self.tools]
        if self.tool_choice is not None:
            body["tool_choice"] = _chat_tool_choice(self.tool_choice)
        response_format = self._response_format()
        if response_format is not None:
            body["response_format"] = response_format
        try:
            return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
        except ValidationError as exc:
            first = exc.errors()[0]
            field = str(first["loc"][0]) if first.get("loc") else "messages"
            param = _CHAT_FIELDS.get(field, field)
            where = ".".join(str(x) for x in first.get("loc", ())[1:])
            raise ResponsesInputError(f"{param} is not valid{f' (at {where})' if where else ''}: {first['msg']}",
                                      param) from None

    def _template_kwargs(self) -> dict[str, Any] | None:
        kwargs = dict(self.chat_template_kwargs or {})
        effort = (self.reasoning or {}).get("effort")
        if effort is not None:
            kwargs.setdefault("reasoning_effort", effort)  # what gpt-oss's template reads, as vLLM passes it
        return kwargs or None

    def _response_format(self) -> dict[str, Any] | None:
        fmt = (self.text or {}).get("format")
        if fmt is None:
            return None
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind in ("text", "json_object"):
            return {"type": kind}
        if kind == "json_schema":
            if not isinstance(fmt.get("schema"), dict):
                raise ResponsesInputError("text.format of type json_schema needs `schema` (a JSON schema).",
                                          "text.format")
            return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt["schema"],
                                                           "strict": fmt.get("strict")}}
        raise ResponsesInputError(f"text.format type must be \"text\", \"json_object\" or \"json_schema\"; got "
                                  f"{kind!r}.", "text.format")


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses function tool (flat: name, parameters) as chat's `{"type", "function": {...}}`."""
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") != "function":
        raise ResponsesInputError(f"tool_choice of type {choice.get('type')!r} is not supported; use \"auto\", "
                                  "\"required\", \"none\" or {\"type\": \"function\", \"name\": ...}.", "tool_choice")
    return {"type": "function", "function": {"name": choice.get("name")}}


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items as chat messages: a message item is a message; consecutive function_call items are
    one assistant turn's tool_calls; a function_call_output is a tool message; a reasoning item's text becomes the
    `reasoning` of the assistant turn after it."""
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ResponsesInputError(f"{where} must be an object.", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ResponsesInputError(f"{where}.role must be user, system, developer or assistant; got "
                                          f"{role!r}.", "input")
            message: dict[str, Any] = {"role": role, "content": _message_content(item.get("content"), where)}
            if role == "assistant" and reasoning is not None:
                message["reasoning"], reasoning = reasoning, None
            messages.append(message)
        elif kind == "function_call":
            call = {"id": _required_str(item, "call_id", where), "type": "function",
                    "function": {"name": _required_str(item, "name", where),
                                 "arguments": item.get("arguments") or "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # a message and its calls are one turn
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            if reasoning is not None:
                messages[-1]["reasoning"], reasoning = reasoning, None
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                output = _content_text(output, where)
            messages.append({"role": "tool", "tool_call_id": _required_str(item, "call_id", where),
                             "content": output})
        elif kind == "reasoning":
            texts = [part.get("text", "") for key in ("content", "summary") for part in item.get(key) or []
                     if isinstance(part, dict)]
            reasoning = "\n".join(t for t in texts if t) or None
        else:
            raise ResponsesInputError(f"{where}: items of type {kind!r} are not supported (message, function_call, "
                                      "function_call_output and reasoning are).", "input")
    return messages


def _required_str(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ResponsesInputError(f"{where}.{key} must be a non-empty string.", "input")
    return value


def _message_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message item's content for chat: its text, or (when it has `input_image` parts) chat's content parts, each
    image an `image_url` part (docs/serving.md, "Images")."""
    if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") == "input_image"
                                                for p in content):
        return _content_text(content, where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                what = "file_id is not supported" if part.get("file_id") else "it needs image_url"
                raise ResponsesInputError(f"{where}.content[{j}]: an input_image part {what}: send image_url (a "
                                          "data: URL, or an http(s) / file:// URL the server allows).", "input")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            kind = part.get("type") if isinstance(part, dict) else None
            text = part.get("refusal" if kind == "refusal" else "text") if kind in _TEXT_PARTS else None
            if not isinstance(text, str):
                raise ResponsesInputError(f"{where}.content[{j}]: content parts of type {kind!r} are not supported "
                                          "(text and input_image are), and a text part needs its text.", "input")
            parts.append({"type": "text", "text": text})
    return parts


def _content_text(content: Any, where: str) -> str:
    """A message's content as text: a string, or text parts (input_text, output_text) joined with newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ResponsesInputError(f"{where}.content must be a string or a list of content parts.", "input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise ResponsesInputError(f"{where}.content[{j}]: content parts of type {kind!r} are not supported "
                                      "(text, and input_image in a message; files and audio are not).", "input")
        texts.append(part.get("text") if kind != "refusal" else part.get("refusal"))
    if not all(isinstance(t, str) for t in texts):
        raise ResponsesInputError(f"{where}.content: a text part needs its text.", "input")
    return "\n".join(texts)


# ---- the response ----------------------------------------------------------------------------------------------

class OutputText(OpenAIBaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(OpenAIBaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText] = Field(default_factory=list)


class FunctionCallItem(OpenAIBaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class ReasoningText(OpenAIBaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class SummaryText(OpenAIBaseModel):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningItem(OpenAIBaseModel):
    """The reasoning parser's text, as vLLM returns it: in `content` (reasoning_text), with an empty summary."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = OutputMessage | FunctionCallItem | ReasoningItem


class InputTokensDetails(OpenAIBaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(OpenAIBaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(OpenAIBaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(OpenAIBaseModel):
    reason: str


class ResponseObject(OpenAIBaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: Literal["queued", "in_progress", "completed", "incomplete", "cancelled", "failed"] = "in_progress"
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    background: bool = False

    @classmethod
    def for_request(cls, response_id: str, model: str, body: ResponsesRequest) -> ResponseObject:
        """The response as first announced (status in_progress, no output yet), echoing the request's settings."""
        return cls(id=response_id, model=model, instructions=body.instructions,
                   max_output_tokens=body.max_output_tokens, parallel_tool_calls=body.parallel_tool_calls,
                   previous_response_id=body.previous_response_id, reasoning=body.reasoning, store=body.store,
                   temperature=body.temperature, text=body.text or {"format": {"type": "text"}},
                   tool_choice=body.tool_choice if body.tool_choice is not None else "auto",
                   tools=list(body.tools or []), top_p=body.top_p, user=body.user, metadata=body.metadata)


def output_as_input(items: list[OutputItem]) -> list[dict[str, Any]]:
    """A response's output items as the input items of the next turn (what previous_response_id prepends)."""
    converted: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, OutputMessage):
            converted.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": part.text} for part in item.content]})
        elif isinstance(item, FunctionCallItem):
            converted.append({"type": "function_call", "call_id": item.call_id, "name": item.name,
                              "arguments": item.arguments})
        else:
            converted.append({"type": "reasoning", "content": [{"type": "reasoning_text", "text": part.text}
                                                               for part in item.content]})
    return converted

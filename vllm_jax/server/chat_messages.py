"""Chat request pieces: messages (text content, earlier tool calls and results, reasoning) and tool definitions,
and the plain dicts a chat template reads (docs/architecture/01-overview.md, "Tool calling and reasoning")."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from vllm_jax.server.openai_base import OpenAIRequestModel


class ContentPart(OpenAIRequestModel):
    type: str
    text: str | None = None


class FunctionCallParam(OpenAIRequestModel):
    name: str
    arguments: str | dict[str, Any] | None = None  # OpenAI sends JSON text; some clients an object


class ToolCallParam(OpenAIRequestModel):
    """A call in an earlier assistant turn, as the client sends it back."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallParam


class ChatMessage(OpenAIRequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None  # assistant turns
    tool_call_id: str | None = None  # tool results: the call they answer
    reasoning: str | None = None  # assistant turns: earlier thinking, for templates that show it

    def text(self) -> str:
        """The content as one string; only text parts are supported (joined with newlines, as vLLM does)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            if part.type != "text":
                raise ValueError(f"only text content parts are supported; got a {part.type!r} part.")
            if part.text is None:
                raise ValueError("a text content part needs a `text` field.")
            texts.append(part.text)
        return "\n".join(texts)


def chat_conversation(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the plain dicts a chat template reads, as vLLM passes them: role, content as text, the
    author's `name`; an assistant turn's `tool_calls` with their arguments parsed into objects (what HF tool
    templates iterate over) and its `reasoning` (also as `reasoning_content`, the name Qwen3's template reads);
    a tool result's `tool_call_id`. Both /v1/chat/completions and /tokenize render through this."""
    conversation = []
    for i, m in enumerate(messages):
        msg: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name is not None:
            msg["name"] = m.name
        if m.role == "assistant" and m.tool_calls:
            msg["tool_calls"] = [_template_tool_call(call, f"messages[{i}].tool_calls[{j}]")
                                 for j, call in enumerate(m.tool_calls)]
        if m.role == "assistant" and m.reasoning is not None:
            msg["reasoning"] = msg["reasoning_content"] = m.reasoning
        if m.role == "tool" and m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        conversation.append(msg)
    return conversation


def _template_tool_call(call: ToolCallParam, where: str) -> dict[str, Any]:
    arguments = call.function.arguments
    if isinstance(arguments, str) and arguments:
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"{where}.function.arguments is not valid JSON: {exc}") from None
    entry: dict[str, Any] = {"type": "function",
                             "function": {"name": call.function.name, "arguments": arguments or {}}}
    if call.id is not None:
        entry["id"] = call.id
    return entry


class FunctionDefinition(OpenAIRequestModel):
    name: str = Field(..., min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments
    strict: bool | None = None


class ChatTool(OpenAIRequestModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition

    def template_dict(self) -> dict[str, Any]:
        """The tool as chat templates read it (transformers' `tools=`): OpenAI's shape, unset fields left out."""
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}

"""Chat request pieces: messages (text and image content, earlier tool calls and results, reasoning) and tool
definitions, and the plain dicts a chat template reads (docs/architecture/01-overview.md, "Tool calling and
reasoning"; images: docs/serving.md, "Images")."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from vllm_jax.multimodal.chat_parts import message_content
from vllm_jax.multimodal.media import ImageSource
from vllm_jax.server.openai_base import OpenAIRequestModel


class ImageURL(OpenAIRequestModel):
    url: str
    detail: Literal["auto", "low", "high"] | None = None  # accepted, as vLLM does; the processor's bounds decide


class ContentPart(OpenAIRequestModel):
    """A content part: text, or an image as OpenAI's `image_url` (an object, or a bare URL as some clients send).
    The offline API's `image_pil` type is refused by name over HTTP (multimodal/chat_parts.py)."""

    type: str
    text: str | None = None
    image_url: ImageURL | str | None = None


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

    def template_content(self, where: str) -> tuple[str | list[dict[str, Any]], list[ImageSource]]:
        """The content as the template reads it (text parts joined with newlines, as vLLM does; with images, a
        list of text and image items) and the images' sources, in order (multimodal/chat_parts.py)."""
        if self.content is None:
            return "", []
        if isinstance(self.content, str):
            return self.content, []
        return message_content([p.model_dump(exclude_none=True) for p in self.content], where, allow_pil=False)


def chat_conversation(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation alone (/tokenize: an image is its one placeholder, not expanded)."""
    return chat_conversation_and_images(messages)[0]


def chat_conversation_and_images(messages: list[ChatMessage]) -> tuple[list[dict[str, Any]], list[ImageSource]]:
    """Messages as the plain dicts a chat template reads, as vLLM passes them: role, content (text, or text and
    image items when the message has images), the author's `name`; an assistant turn's `tool_calls` with their
    arguments parsed into objects (what HF tool templates iterate over) and its `reasoning` (also as
    `reasoning_content`, the name Qwen3's template reads); a tool result's `tool_call_id`. Also the images'
    sources, in the order the template writes their placeholders."""
    conversation, images = [], []
    for i, m in enumerate(messages):
        content, found = m.template_content(f"messages[{i}]")
        images += found
        msg: dict[str, Any] = {"role": m.role, "content": content}
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
    return conversation, images


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

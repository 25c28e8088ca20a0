"""Reading tool calls out of JSON text: one value at a position, and a call from a decoded object."""

from __future__ import annotations

import json
from typing import Any

from vllm_jax.server.tool_parsers.base import ParsedToolCall

_DECODER = json.JSONDecoder()


def decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """The JSON value starting at `pos` (after whitespace) and the index after it; None when the text there is
    not (yet) a complete value. Model output can nest arbitrarily deep, so running out of stack is a None too."""
    pos = skip_space(text, pos)
    try:
        return _DECODER.raw_decode(text, pos)
    except (ValueError, RecursionError):
        return None


def skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def call_from(obj: Any, arguments_keys: tuple[str, ...] = ("arguments",)) -> ParsedToolCall | None:
    """A call from `{"name": str, <arguments key>: object}`; None for anything else (no name, arguments that
    are not an object: OpenAI clients json.loads the arguments and expect an object)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    key = next((k for k in arguments_keys if k in obj), None)
    if key is None or not isinstance(obj[key], dict):
        return None
    return ParsedToolCall(obj["name"], json.dumps(obj[key], ensure_ascii=False))


def call_from_text(text: str) -> ParsedToolCall | None:
    """A call from text holding exactly one JSON object (whitespace around it allowed)."""
    decoded = decode_at(text, 0)
    if decoded is None or skip_space(text, decoded[1]) != len(text):
        return None
    return call_from(decoded[0])

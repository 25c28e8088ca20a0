"""`llama3_json` (Llama 3.1 / 3.2 / 3.3 JSON tool calls): the answer starts with `{"name": ..., "parameters":
{...}}`, optionally after `<|python_tag|>`, several calls separated by `;`.

Either `parameters` (Llama's prompt format) or `arguments` holds the arguments; whatever follows the last call
is dropped, and an answer whose first JSON value is not a call is plain content. vLLM's parser for a finished
output also finds calls after other text (and drops that text), while its streaming parser only sees calls that
start the output; here both follow the streaming rule, so that streamed and whole answers agree.
"""

from __future__ import annotations

from vllm_jax.server.tool_parsers.base import (
    ExtractedToolCalls,
    ParsedToolCall,
    Scan,
    ToolParser,
)
from vllm_jax.server.tool_parsers.json_calls import call_from, decode_at, skip_space

PYTHON_TAG = "<|python_tag|>"
_ARGUMENT_KEYS = ("arguments", "parameters")


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def extract(self, text: str) -> ExtractedToolCalls:
        start = _calls_start(text)
        calls = _read_calls(text, start) if start is not None else []
        return ExtractedToolCalls(calls, None) if calls else ExtractedToolCalls([], text or None)

    def scan(self, text: str, settled: int) -> Scan:
        if settled:  # content went out, so the answer did not start with a call
            return Scan(len(text), [])
        head = text.lstrip()
        if not head or PYTHON_TAG.startswith(head):
            return Scan(0, [])  # not decided yet
        start = _calls_start(text)
        if start is None:
            return Scan(len(text), [])
        return Scan(0, _read_calls(text, start))


def _calls_start(text: str) -> int | None:
    """Where the JSON of the calls begins, or None when the answer does not start with a call."""
    pos = skip_space(text, 0)
    if text.startswith(PYTHON_TAG, pos):
        return pos + len(PYTHON_TAG)
    return pos if text.startswith("{", pos) else None


def _read_calls(text: str, pos: int) -> list[ParsedToolCall]:
    """The complete `;`-separated calls from `pos`, up to the first JSON value that is not one."""
    calls: list[ParsedToolCall] = []
    while (decoded := decode_at(text, pos)) is not None and (call := call_from(decoded[0], _ARGUMENT_KEYS)):
        calls.append(call)
        pos = skip_space(text, decoded[1])
        if not text.startswith(";", pos):
            break
        pos += 1
    return calls

"""`hermes` (Hermes 2 Pro, Qwen2.5, Qwen3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, repeated.

As vLLM's parser: the content is the text before the first `<tool_call>`; text between and after calls is
dropped; a last call may lack its closing tag (the model stopped right after it); when the first call is not a
JSON object with a name and object arguments, the whole output is plain content. A malformed call after good
ones ends the calls there (vLLM then makes the whole output plain content): a stream has sent the good ones
already, and this way streamed and whole answers agree.
"""

from __future__ import annotations

from collections.abc import Iterator

from vllm_jax.server.tool_parsers.base import (
    ExtractedToolCalls,
    ParsedToolCall,
    Scan,
    ToolParser,
)
from vllm_jax.server.tool_parsers.json_calls import call_from_text
from vllm_jax.utils import partial_marker_len

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"

    def extract(self, text: str) -> ExtractedToolCalls:
        first = text.find(START)
        if first < 0:
            return ExtractedToolCalls([], text or None)
        calls = _calls(text, first, closed_only=False)
        return ExtractedToolCalls(calls, text[:first] or None) if calls else ExtractedToolCalls([], text)

    def scan(self, text: str, settled: int) -> Scan:
        first = text.find(START, settled)
        if first < 0:
            return Scan(len(text) - partial_marker_len(text, START), [])
        return Scan(first, _calls(text, first, closed_only=True))


def _calls(text: str, first: int, closed_only: bool) -> list[ParsedToolCall]:
    """The calls from `first` on, up to the first malformed one."""
    calls = []
    for body in _bodies(text, first, closed_only):
        call = call_from_text(body)
        if call is None:
            break
        calls.append(call)
    return calls


def _bodies(text: str, pos: int, closed_only: bool) -> Iterator[str]:
    """The text inside each `<tool_call>` from `pos` on; an unclosed last one runs to the end of the text."""
    while (start := text.find(START, pos)) >= 0:
        end = text.find(END, start + len(START))
        if end < 0:
            if not closed_only:
                yield text[start + len(START):]
            return
        yield text[start + len(START):end]
        pos = end + len(END)

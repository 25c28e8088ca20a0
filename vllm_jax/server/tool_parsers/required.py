"""`tool_choice: "required"`: structured outputs force a JSON list of `{"name": ..., "parameters": {...}}`
(vLLM's schema), read here into calls.

Entries count as they complete, in a finished output as in a stream, so both agree even when max_tokens cuts the
list short (the complete entries are the calls; with none, the text is plain content).
"""

from __future__ import annotations

from vllm_jax.server.tool_parsers.base import (
    ExtractedToolCalls,
    ParsedToolCall,
    Scan,
    ToolParser,
)
from vllm_jax.server.tool_parsers.json_calls import call_from, decode_at, skip_space


class RequiredToolParser(ToolParser):
    name = "required"

    def extract(self, text: str) -> ExtractedToolCalls:
        calls = _complete_entries(text)
        return ExtractedToolCalls(calls, None) if calls else ExtractedToolCalls([], text or None)

    def scan(self, text: str, settled: int) -> Scan:
        return Scan(0, _complete_entries(text))


def _complete_entries(text: str) -> list[ParsedToolCall]:
    """The list's complete entries, up to the first that is not a call."""
    pos = skip_space(text, 0)
    if not text.startswith("[", pos):
        return []
    calls: list[ParsedToolCall] = []
    pos += 1
    while (decoded := decode_at(text, pos)) is not None:
        call = call_from(decoded[0], ("parameters",))
        if call is None:
            break
        calls.append(call)
        pos = skip_space(text, decoded[1])
        if not text.startswith(",", pos):
            break
        pos += 1
    return calls

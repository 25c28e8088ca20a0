"""`mistral` (Mistral 7B Instruct v0.3, Mistral Nemo, and others with Mistral's HF chat templates):
`[TOOL_CALLS]` then a JSON list of `{"name": ..., "arguments": {...}}`.

As vLLM's parser for HF tokenizers: the content is the text before the marker, text after the list is ignored,
and `[TOOL_CALLS]` is a special token, so the text keeps special tokens when tools are offered. Ids are 9
letters and digits, the form Mistral's templates demand of the ids the next turn sends back. When the list is
malformed the output is plain content (vLLM then also drops the marker; here the text stays as it came).
"""

from __future__ import annotations

import random
import string

from vllm_jax.server.tool_parsers.base import (
    ExtractedToolCalls,
    ParsedToolCall,
    Scan,
    ToolParser,
)
from vllm_jax.server.tool_parsers.json_calls import call_from, decode_at
from vllm_jax.utils import partial_marker_len

MARKER = "[TOOL_CALLS]"
_ID_CHARS = string.ascii_letters + string.digits


class MistralToolParser(ToolParser):
    name = "mistral"
    keeps_special_tokens = True

    def extract(self, text: str) -> ExtractedToolCalls:
        first = text.find(MARKER)
        if first < 0:
            return ExtractedToolCalls([], text or None)
        calls = _read_list(text, first + len(MARKER))
        if not calls:
            return ExtractedToolCalls([], text)
        return ExtractedToolCalls(calls, text[:first] or None)

    def scan(self, text: str, settled: int) -> Scan:
        first = text.find(MARKER, settled)
        if first < 0:
            return Scan(len(text) - partial_marker_len(text, MARKER), [])
        return Scan(first, _read_list(text, first + len(MARKER)))

    def new_call_id(self) -> str:
        return "".join(random.choices(_ID_CHARS, k=9))


def _read_list(text: str, pos: int) -> list[ParsedToolCall]:
    """The calls of a complete JSON list at `pos`; [] when it is incomplete or any entry is not a call."""
    decoded = decode_at(text, pos)
    if decoded is None or not isinstance(decoded[0], list):
        return []
    calls = []
    for entry in decoded[0]:
        call = call_from(entry)
        if call is None:
            return []
        calls.append(call)
    return calls

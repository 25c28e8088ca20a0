"""The tool-parser contract: a model's output text in, OpenAI tool calls (name + JSON arguments) out.

A parser is stateless (one instance serves every request) and answers two questions:
- `extract(text)`: the calls and the content of a finished output (when the first call is malformed there are
  none, and the whole output is content).
- `scan(text, settled)`: what a partial output already settles: the end of the text that is surely content
  whatever comes next, and the calls that are complete. `settled` is how much content was already sent (the
  scan may start there). ToolCallStreamer turns successive scans into deltas.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's `function.arguments`)


@dataclass(frozen=True)
class ExtractedToolCalls:
    calls: list[ParsedToolCall]
    content: str | None  # None when empty


@dataclass(frozen=True)
class Scan:
    content_end: int  # text[:content_end] is content whatever follows
    calls: list[ParsedToolCall]  # the calls complete so far, in order


def random_call_id() -> str:
    """vLLM's tool call id: `chatcmpl-tool-` and a random hex uuid."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


class ToolParser(ABC):
    name: ClassVar[str]
    # The markers are special tokens in some tokenizers: decode them into the text when tools are offered.
    keeps_special_tokens: ClassVar[bool] = False

    @abstractmethod
    def extract(self, text: str) -> ExtractedToolCalls:
        """The calls and content of a finished output."""

    @abstractmethod
    def scan(self, text: str, settled: int) -> Scan:
        """What `text` (a prefix of the output) already settles; text[:settled] is content already sent."""

    def new_call_id(self) -> str:
        """An id for a call this parser found (the next turn's template may check its form)."""
        return random_call_id()

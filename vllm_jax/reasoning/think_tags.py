"""Reasoning delimited by think tags (`<think>` ... `</think>`), as vLLM's deepseek_r1 and qwen3 parsers read it.

The rules, for a finished output:
- A start tag at the very beginning (after whitespace) is dropped; templates that open the think block in the
  prompt make the model start inside it, so the tag is optional.
- Everything before the first end tag is reasoning, everything after it the answer (None when empty).
- Without an end tag the whole output is reasoning: the model was cut off while thinking.
- With thinking off (qwen3 with `enable_thinking: false`, whose template closes the block in the prompt) the
  whole output is the answer.
- A constrained output (structured outputs) without an end tag is the answer: the engine applies a constraint
  either after the end tag (vLLM's way, when it gates on the reasoning parser) or from the first token, and
  either way the constrained text is the answer. Streamed, it waits for the end tag or the end of the output.

vLLM drops a start tag wherever it appears, discarding the text before it; here only a leading one counts,
because a stream cannot take back text it has already sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_jax.utils import partial_marker_len


@dataclass(frozen=True)
class ThinkTagParser:
    name: str
    start_token: str = "<think>"
    end_token: str = "</think>"
    honours_enable_thinking: bool = False
    keeps_special_tokens: bool = False  # the tags are special tokens the detokenizer must keep (harmony's)

    def thinking(self, chat_template_kwargs: dict[str, Any] | None) -> bool:
        """Whether the model thinks for this request. Only `enable_thinking: false` turns it off, the test the
        Qwen3 template itself makes (`enable_thinking is false`)."""
        kwargs = chat_template_kwargs or {}
        return not (self.honours_enable_thinking and kwargs.get("enable_thinking", True) is False)

    def split(self, text: str, thinking: bool = True, constrained: bool = False) -> tuple[str | None, str | None]:
        """(reasoning, content) of a finished output; an empty part is None."""
        if not thinking:
            return None, text or None
        body = self._after_start_tag(text)
        reasoning, found, content = body.partition(self.end_token)
        if not found:
            return (None, body or None) if constrained else (body or None, None)
        return reasoning or None, content or None

    def streamer(self, thinking: bool = True, constrained: bool = False) -> ReasoningStreamer:
        return ReasoningStreamer(self, thinking, constrained)

    def _after_start_tag(self, text: str) -> str:
        stripped = text.lstrip()
        return stripped[len(self.start_token):] if stripped.startswith(self.start_token) else text


_START, _REASONING, _CONTENT = "start", "reasoning", "content"


class ReasoningStreamer:
    """One output's deltas in, (reasoning, content) deltas out, adding up to `split` of the whole text. Text
    that could still become a tag is held back until the next delta (or `finish`) settles it."""

    def __init__(self, parser: ThinkTagParser, thinking: bool, constrained: bool = False):
        self._parser = parser
        self._state = _START if thinking else _CONTENT
        self._constrained = constrained  # without an end tag it is all answer: hold until one settles it
        self._held = ""

    def push(self, delta: str) -> tuple[str, str]:
        text, self._held = self._held + delta, ""
        if self._state == _START:
            stripped, tag = text.lstrip(), self._parser.start_token
            if stripped.startswith(tag):
                text, self._state = stripped[len(tag):], _REASONING
            elif tag.startswith(stripped):  # whitespace, or part of the tag: not decided yet
                self._held = text
                return "", ""
            else:
                self._state = _REASONING
        if self._state == _CONTENT:
            return "", text
        reasoning, found, content = text.partition(self._parser.end_token)
        if found:
            self._state = _CONTENT
            return reasoning, content
        keep = len(text) if self._constrained else partial_marker_len(text, self._parser.end_token)
        self._held = text[len(text) - keep:]
        return text[:len(text) - keep], ""

    def finish(self) -> tuple[str, str]:
        """What is still held back: reasoning, since no end tag completed it (the answer, when constrained)."""
        held, self._held = self._held, ""
        return ("", held) if self._constrained else (held, "")

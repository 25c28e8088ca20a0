"""gpt-oss's harmony format read as text (vLLM's `openai_gptoss` reasoning parser): the analysis channel is the
reasoning, the final channel the answer (docs/architecture/01-overview.md, "Tool calling and reasoning").

After the template's `<|start|>assistant`, gpt-oss writes
`<|channel|>analysis<|message|>THINKING<|end|><|start|>assistant<|channel|>final<|message|>ANSWER` (the
`<|return|>` that ends it is a stop token, not text), or, for a tool call, a commentary message addressed
`to=functions.NAME` after the analysis (read by the `openai` tool parser, server/tool_parsers/openai.py). The
markers are special tokens, so the detokenizer keeps them (`keeps_special_tokens`).

This is the think-tag rule with harmony's markers (start `<|channel|>analysis<|message|>`, end `<|end|>`, a single
token, so the structured-output gate works), plus one step: the final channel's header that follows is dropped,
so the content is the answer's text; any other message (a commentary call) is left whole for the tool parser.
The openai-harmony package would need its tiktoken vocabulary downloaded; reading the decoded text needs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_jax.reasoning.think_tags import ReasoningStreamer, ThinkTagParser
from vllm_jax.utils import partial_marker_len

ANALYSIS = "<|channel|>analysis<|message|>"
END = "<|end|>"
FINAL_HEADER = "<|start|>assistant<|channel|>final<|message|>"
_TRAILERS = ("<|return|>", "<|end|>")


def final_answer(text: str) -> str:
    """`text` without the final channel's header (and a trailing end marker) when it is a final message."""
    if not text.startswith(FINAL_HEADER):
        return text
    body = text[len(FINAL_HEADER):]
    for trailer in _TRAILERS:
        if body.endswith(trailer):
            return body[:-len(trailer)]
    return body


@dataclass(frozen=True)
class HarmonyParser(ThinkTagParser):
    name: str = "openai_gptoss"
    start_token: str = ANALYSIS
    end_token: str = END
    keeps_special_tokens: bool = True

    def split(self, text: str, thinking: bool = True, constrained: bool = False) -> tuple[str | None, str | None]:
        reasoning, content = super().split(text, thinking, constrained)
        return reasoning, (final_answer(content) or None) if content is not None else None

    def streamer(self, thinking: bool = True, constrained: bool = False) -> ReasoningStreamer:
        return HarmonyStreamer(self, thinking, constrained)


class HarmonyStreamer(ReasoningStreamer):
    """The think-tag streamer, with the content held until it is known whether it opens with the final header
    (then dropped, and the answer's trailing end marker too) or not (then sent whole)."""

    def __init__(self, parser: HarmonyParser, thinking: bool, constrained: bool = False):
        super().__init__(parser, thinking, constrained)
        self._content = ""  # content held back: maybe the final header, or a trailer arriving
        self._decided = self._final = False

    def push(self, delta: str) -> tuple[str, str]:
        reasoning, content = super().push(delta)
        return reasoning, self._settle(content, finished=False)

    def finish(self) -> tuple[str, str]:
        reasoning, content = super().finish()
        return reasoning, self._settle(content, finished=True)

    def _settle(self, content: str, finished: bool) -> str:
        text, self._content = self._content + content, ""
        if not self._decided:
            if FINAL_HEADER.startswith(text) and not finished:
                self._content = text  # maybe the header: wait
                return ""
            self._decided, self._final = True, text.startswith(FINAL_HEADER)
            text = text[len(FINAL_HEADER):] if self._final else text
        if not self._final:
            return text
        if finished:
            return _strip_trailer(text)
        keep = max(_held_trailer(text, trailer) for trailer in _TRAILERS)  # a trailer may be arriving
        self._content = text[len(text) - keep:]
        return text[:len(text) - keep]


def _held_trailer(text: str, trailer: str) -> int:
    return len(trailer) if text.endswith(trailer) else partial_marker_len(text, trailer)


def _strip_trailer(text: str) -> str:
    for trailer in _TRAILERS:
        if text.endswith(trailer):
            return text[:-len(trailer)]
    return text

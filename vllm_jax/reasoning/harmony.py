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
gpt-oss may also skip the analysis and open its first message with another channel (`<|channel|>final...`,
`<|channel|>commentary to=functions.f...`) or with the recipient (` to=functions.f<|channel|>...`): then there is
no reasoning and the content is that message with the header's `<|start|>assistant` (in the prompt) put back, so
the final header is dropped and the tool parser finds the call as it would after an analysis.
The openai-harmony package would need its tiktoken vocabulary downloaded; reading the decoded text needs nothing
(docs/responses.md, "gpt-oss (harmony)").
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_jax.reasoning.think_tags import ReasoningStreamer, ThinkTagParser
from vllm_jax.utils import partial_marker_len

ANALYSIS = "<|channel|>analysis<|message|>"
END = "<|end|>"
START_ASSISTANT = "<|start|>assistant"
FINAL_HEADER = START_ASSISTANT + "<|channel|>final<|message|>"
_CHANNEL, _RECIPIENT = "<|channel|>", "to="
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


def opening(text: str) -> str | None:
    """How the output opens: "other" (a message of another channel than analysis, or with a recipient first),
    "analysis" (the think-tag rule reads it), or None while its start could still be either."""
    stripped = text.lstrip()
    if stripped.startswith(ANALYSIS):
        return "analysis"
    for marker in (_CHANNEL, _RECIPIENT):
        if stripped.startswith(marker):
            return None if ANALYSIS.startswith(stripped) else "other"
        if marker.startswith(stripped):
            return None
    return "analysis"


def _as_message(text: str) -> str:
    """An output that opens with another message, with the header's start (in the prompt) put back."""
    stripped = text.lstrip()
    return START_ASSISTANT + (" " if stripped.startswith(_RECIPIENT) else "") + stripped


@dataclass(frozen=True)
class HarmonyParser(ThinkTagParser):
    name: str = "openai_gptoss"
    start_token: str = ANALYSIS
    end_token: str = END
    keeps_special_tokens: bool = True

    def split(self, text: str, thinking: bool = True, constrained: bool = False) -> tuple[str | None, str | None]:
        if thinking and opening(text) == "other":
            return None, final_answer(_as_message(text)) or None
        reasoning, content = super().split(text, thinking, constrained)
        return reasoning, (final_answer(content) or None) if content is not None else None

    def streamer(self, thinking: bool = True, constrained: bool = False) -> ReasoningStreamer:
        return HarmonyStreamer(self, thinking, constrained)


class HarmonyStreamer(ReasoningStreamer):
    """The think-tag streamer, with the content held until it is known whether it opens with the final header
    (then dropped, and the answer's trailing end marker too) or not (then sent whole). The output's opening is
    held until `opening` decides it; one that is not the analysis is all content, as in `split`."""

    def __init__(self, parser: HarmonyParser, thinking: bool, constrained: bool = False):
        super().__init__(parser, thinking, constrained)
        self._content = ""  # content held back: maybe the final header, or a trailer arriving
        self._decided = self._final = False
        self._opening: str | None = "" if thinking else None  # the start, until `opening` decides it
        self._no_analysis = False

    def push(self, delta: str) -> tuple[str, str]:
        if self._opening is not None:
            text = self._opening + delta
            kind = opening(text)
            if kind is None:
                self._opening = text
                return "", ""
            self._opening, delta = None, text
            if kind == "other":
                self._no_analysis, delta = True, _as_message(text)
        if self._no_analysis:
            return "", self._settle(delta, finished=False)
        reasoning, content = super().push(delta)
        return reasoning, self._settle(content, finished=False)

    def finish(self) -> tuple[str, str]:
        if self._no_analysis:
            return "", self._settle("", finished=True)
        reasoning = ""
        if self._opening:  # undecided at the end: the think-tag rule, as `split`
            reasoning, content = super().push(self._opening)
            self._opening, self._content = None, self._content + content
        held_reasoning, content = super().finish()
        return reasoning + held_reasoning, self._settle(content, finished=True)

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

"""Tool calls from a stream of text deltas, with any ToolParser.

Content that can no longer open a call goes out at once, each call as soon as it is complete (its whole
arguments in one delta, which OpenAI clients accumulate like any other), and `finish` settles the rest with
the parser's rule for a finished output. The parsers' rules are chosen so that a call, once complete, stays a
call whatever follows (a malformed later call ends the calls instead of undoing them), which is what makes the
stream add up to what `extract` gives for the whole text.
"""

from __future__ import annotations

from vllm_jax.server.tool_parsers.base import ParsedToolCall, ToolParser


class ToolCallStreamer:
    def __init__(self, parser: ToolParser):
        self.parser = parser
        self.text = ""
        self._sent_content = 0  # characters of self.text sent as content
        self._sent_calls = 0

    def push(self, delta: str) -> tuple[str, list[ParsedToolCall]]:
        """The content and the calls that `delta` settles."""
        self.text += delta
        scan = self.parser.scan(self.text, self._sent_content)
        return self._advance(self.text[:scan.content_end], scan.calls)

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        """Whatever is left once the output is complete."""
        final = self.parser.extract(self.text)
        return self._advance(final.content or "" if final.calls else self.text, final.calls)

    def _advance(self, content: str, calls: list[ParsedToolCall]) -> tuple[str, list[ParsedToolCall]]:
        new_content = content[self._sent_content:]
        new_calls = calls[self._sent_calls:]
        self._sent_content = max(self._sent_content, len(content))
        self._sent_calls = max(self._sent_calls, len(calls))
        return new_content, new_calls

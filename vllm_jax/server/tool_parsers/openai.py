"""`openai` (gpt-oss, harmony format): a call is a commentary message addressed to a function,
`<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}` (the recipient may
also stand before `<|channel|>`), ended by `<|call|>` (a stop token, so usually not in the text), as vLLM's
`openai` tool parser reads it. With `--reasoning-parser openai_gptoss` the analysis message is already taken off
(vllm_jax/reasoning/harmony.py); the content is the text before the first message header. A final-channel message
among the messages adds its text to the content; a commentary message to no function is content too. When the
first call's arguments are not a JSON object the whole output is content; a malformed later call ends the calls.
"""

from __future__ import annotations

import json
import re

from vllm_jax.server.tool_parsers.base import ExtractedToolCalls, ParsedToolCall, Scan, ToolParser
from vllm_jax.server.tool_parsers.json_calls import decode_at, skip_space
from vllm_jax.utils import partial_marker_len

START = "<|start|>"
_HEADER = re.compile(r"<\|start\|>assistant(?P<head>[^<]*)<\|channel\|>(?P<channel>[^<\s]+)(?P<tail>[^<]*)"
                     r"(?:<\|constrain\|>[^<]*)?<\|message\|>")
_RECIPIENT = re.compile(r"to=functions\.(?P<name>[^\s<]+)")
_ENDS = ("<|call|>", "<|end|>", START)


class OpenAIToolParser(ToolParser):
    name = "openai"
    keeps_special_tokens = True

    def extract(self, text: str) -> ExtractedToolCalls:
        first = text.find(START)
        if first < 0:
            return ExtractedToolCalls([], text or None)
        calls, extra = _messages(text, first, closed_only=False)
        if not calls:
            return ExtractedToolCalls([], text)
        return ExtractedToolCalls(calls, (text[:first] + extra) or None)

    def scan(self, text: str, settled: int) -> Scan:
        first = text.find(START, settled)
        if first < 0:
            return Scan(len(text) - partial_marker_len(text, START), [])
        return Scan(first, _messages(text, first, closed_only=True)[0])


def _messages(text: str, pos: int, closed_only: bool) -> tuple[list[ParsedToolCall], str]:
    """The calls from `pos` on (up to the first malformed one) and the text of the other messages."""
    calls: list[ParsedToolCall] = []
    content = ""
    while (header := _HEADER.match(text, pos)) is not None:
        body_start = header.end()
        ends = [i for i in (text.find(end, body_start) for end in _ENDS) if i >= 0]
        if not ends and closed_only:
            break
        body_end = min(ends) if ends else len(text)
        body = text[body_start:body_end]
        recipient = _RECIPIENT.search(header.group("head") + header.group("tail"))
        if recipient is None:
            content += body
        else:
            arguments = _arguments(body)
            if arguments is None:
                break
            calls.append(ParsedToolCall(recipient.group("name"), arguments))
        pos = body_end
        for end in ("<|call|>", "<|end|>"):
            if text.startswith(end, pos):
                pos += len(end)
    return calls, content


def _arguments(body: str) -> str | None:
    """The call's arguments: the body, when it is exactly one JSON object."""
    decoded = decode_at(body, 0)
    if decoded is None or not isinstance(decoded[0], dict) or skip_space(body, decoded[1]) != len(body):
        return None
    return json.dumps(decoded[0], ensure_ascii=False)

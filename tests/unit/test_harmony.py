"""gpt-oss's harmony format read as text: the `openai_gptoss` reasoning parser (vllm_jax/reasoning/harmony.py) and
the `openai` tool parser (vllm_jax/server/tool_parsers/openai.py), whole and streamed, alone and together in the
ChatOutputRules that /v1/chat/completions and /v1/responses share."""

from __future__ import annotations

import json

import pytest

from vllm_jax.reasoning import get_reasoning_parser
from vllm_jax.server.chat_output import ChatOutputRules
from vllm_jax.server.protocol import ChatCompletionRequest
from vllm_jax.server.tool_parsers import ToolCallStreamer, get_tool_parser

PARSER = get_reasoning_parser("openai_gptoss")
TOOLS = get_tool_parser("openai")
ANSWER = ("<|channel|>analysis<|message|>The user wants the weather.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>")
CALL = ("<|channel|>analysis<|message|>Use the tool.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris"}<|call|>')
CALL_HEADER_FIRST = ('<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>')


def _streamed(text: str, size: int, thinking: bool = True) -> tuple[str, str]:
    streamer = PARSER.streamer(thinking)
    reasoning = content = ""
    for i in range(0, len(text), size):
        r, c = streamer.push(text[i:i + size])
        reasoning, content = reasoning + r, content + c
    r, c = streamer.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize(("text", "expected"), [
    (ANSWER, ("The user wants the weather.", "It is sunny.")),
    ("<|channel|>analysis<|message|>Cut off while thi", ("Cut off while thi", None)),
    (CALL, ("Use the tool.", CALL.split("<|end|>", 1)[1])),  # a call is left whole for the tool parser
    # no analysis: the first message is another channel, or names its recipient first (no reasoning then)
    ("<|channel|>final<|message|>Sunny.<|return|>", (None, "Sunny.")),
    (CALL.split("<|start|>assistant", 1)[1], (None, CALL.split("<|end|>", 1)[1])),
    (" to=functions.f<|channel|>commentary json<|message|>{}", (None, "<|start|>assistant to=functions.f"
                                                                 "<|channel|>commentary json<|message|>{}")),
    ("today", ("today", None)),  # no harmony header at all: the think-tag rule (cut off while thinking)
])
def test_reasoning_is_the_analysis_channel_and_content_the_final_one_whole_and_streamed(text: str, expected: tuple):
    assert PARSER.split(text) == expected
    assert PARSER.keeps_special_tokens and PARSER.end_token == "<|end|>"  # one token in gpt-oss: the gate works
    for size in (1, 2, 5, 13, len(text)):
        assert _streamed(text, size) == tuple(part or "" for part in expected), size


def test_the_openai_tool_parser_reads_commentary_messages_to_functions_whole_and_streamed():
    text = CALL.split("<|end|>", 1)[1] + CALL_HEADER_FIRST
    extracted = TOOLS.extract("Let me check." + text)
    assert extracted.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in extracted.calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    for size in (1, 3, 7, len(text)):
        streamer = ToolCallStreamer(TOOLS)
        content, calls = "", []
        for i in range(0, len(text), size):
            c, found = streamer.push(text[i:i + size])
            content, calls = content + c, calls + found
        c, found = streamer.finish()
        assert (content + c, calls + found) == ("", extracted.calls), size
    malformed = "<|start|>assistant<|channel|>commentary to=functions.f<|message|>{not json"
    assert (TOOLS.extract(malformed).calls, TOOLS.extract(malformed).content) == ([], malformed)
    assert TOOLS.extract("plain").content == "plain"


def test_chat_rules_split_a_harmony_call_into_reasoning_and_a_call_streamed_alike():
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Weather?"}], "tools": [
        {"type": "function", "function": {"name": "get_weather"}}]})
    rules = ChatOutputRules.for_request(body, TOOLS, PARSER, constrained=False)
    assert rules.keeps_special_tokens
    message, finish = rules.message(CALL, "stop")
    assert (message.reasoning, message.content, finish) == ("Use the tool.", None, "tool_calls")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    streamer = rules.streamer()
    deltas = [streamer.push(CALL[i:i + 4], finished=i + 4 >= len(CALL)) for i in range(0, len(CALL), 4)]
    assert "".join(d.reasoning or "" for d in deltas) == "Use the tool."
    assert "".join(d.content or "" for d in deltas) == ""
    assert [p.function.name for d in deltas for p in d.tool_calls or []] == ["get_weather"]
    answer, _ = rules.message(ANSWER, "stop")
    assert (answer.reasoning, answer.content, answer.tool_calls) == ("The user wants the weather.", "It is sunny.", [])

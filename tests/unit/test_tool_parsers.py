"""Tool-call parsers (vllm_jax/server/tool_parsers/) without a server: each format's finished outputs, the same
outputs streamed in every chunking, and malformed output staying plain content."""

from __future__ import annotations

import json
import random

import pytest

from vllm_jax.server.tool_parsers import (
    RequiredToolParser,
    ToolCallStreamer,
    ToolParser,
    auto_tool_parser,
    get_tool_parser,
)

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, {"unit": "C"}]}}'
WEATHER_CALL = ("get_weather", {"city": "Paris", "days": [1, {"unit": "C"}]})
TIME_CALL = ("get_time", {})

# (parser, output, expected calls as (name, arguments), expected content)
CASES = [
    ("hermes", (f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>"
                '{"name": "get_time", "arguments": {}}</tool_call>'), [WEATHER_CALL, TIME_CALL], "Let me check.\n"),
    ("hermes", f"<tool_call>{WEATHER}", [WEATHER_CALL], None),  # the model stopped before the closing tag
    ("hermes", "Paris is sunny.", [], "Paris is sunny."),
    ("hermes", "It starts <tool_call>{not json}</tool_call>", [], "It starts <tool_call>{not json}</tool_call>"),
    ("hermes", '<tool_call>{"name": "f"}</tool_call>', [], '<tool_call>{"name": "f"}</tool_call>'),  # no arguments
    ("hermes", f"<tool_call>{WEATHER}</tool_call><tool_call>[1]</tool_call>", [WEATHER_CALL], None),  # ends there
    ("hermes", f"<tool_call>{WEATHER}</tool_call>\n<tool_call>{{\"name\": \"get_ti", [WEATHER_CALL], None),
    ("hermes", "a lone <tool_", [], "a lone <tool_"),
    ("llama3_json", ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, '
                     '{"unit": "C"}]}}; {"name": "get_time", "arguments": {}}'), [WEATHER_CALL, TIME_CALL], None),
    ("llama3_json", f"  {WEATHER}\n", [WEATHER_CALL], None),
    ("llama3_json", f"{WEATHER} and some words after", [WEATHER_CALL], None),  # what follows the calls is dropped
    ("llama3_json", '{"answer": 42}', [], '{"answer": 42}'),  # JSON that is not a call
    ("llama3_json", f"Sure: {WEATHER}", [], f"Sure: {WEATHER}"),  # calls must start the answer
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Par', [],
     '{"name": "get_weather", "parameters": {"city": "Par'),  # cut off
    ("llama3_json", "<|python", [], "<|python"),
    ("mistral", f'[TOOL_CALLS] [{WEATHER}, {{"name": "get_time", "arguments": {{}}}}]', [WEATHER_CALL, TIME_CALL],
     None),
    ("mistral", f"Sure.[TOOL_CALLS][{WEATHER}] trailing", [WEATHER_CALL], "Sure."),
    ("mistral", '[TOOL_CALLS][{"name": 3, "arguments": {}}]', [], '[TOOL_CALLS][{"name": 3, "arguments": {}}]'),
    ("mistral", "[TOOL_CALLS][{", [], "[TOOL_CALLS][{"),
    ("mistral", "No tools needed [TOOL", [], "No tools needed [TOOL"),
    ("required", ('[{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, {"unit": "C"}]}}, '
                  '{"name": "get_time", "parameters": {}}]'), [WEATHER_CALL, TIME_CALL], None),
    ("required", ('[{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, {"unit": "C"}]}}, '
                  '{"name": "get_ti'), [WEATHER_CALL], None),  # max_tokens cut the list: complete entries count
    ("required", "not a list", [], "not a list"),
]


def _parser(name: str) -> ToolParser:
    return RequiredToolParser() if name == "required" else get_tool_parser(name)


def _calls(calls: list) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def _streamed(parser: ToolParser, text: str, sizes: list[int]) -> tuple[str, list]:
    """Push `text` in chunks of the given sizes (cycled), then finish: the content and calls that came out."""
    streamer, content, calls, pos, i = ToolCallStreamer(parser), "", [], 0, 0
    while pos < len(text):
        piece, pos, i = text[pos:pos + sizes[i % len(sizes)]], pos + sizes[i % len(sizes)], i + 1
        more, new = streamer.push(piece)
        content, calls = content + more, calls + new
    more, new = streamer.finish()
    return content + more, calls + new


@pytest.mark.parametrize("name,text,calls,content", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_finished_output_gives_its_calls_and_content(name: str, text: str, calls: list, content: str | None):
    extracted = _parser(name).extract(text)
    assert (_calls(extracted.calls), extracted.content) == (calls, content)
    for call in extracted.calls:  # arguments are JSON text of an object, as OpenAI clients expect
        assert isinstance(json.loads(call.arguments), dict)


@pytest.mark.parametrize("name,text,calls,content", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_streamed_output_adds_up_to_the_finished_one_in_any_chunking(name: str, text: str, calls: list,
                                                                        content: str | None):
    rng = random.Random(len(text))
    chunkings = [[1], [2], [3], [7], [len(text)]] + [[rng.randint(1, 6) for _ in range(9)] for _ in range(6)]
    for sizes in chunkings:
        streamed_content, streamed_calls = _streamed(_parser(name), text, sizes)
        assert ((streamed_content or None), _calls(streamed_calls)) == (content, calls), sizes


def test_plain_text_streams_at_once_and_only_a_possible_marker_waits():
    streamer = ToolCallStreamer(get_tool_parser("hermes"))
    assert streamer.push("Hello") == ("Hello", [])
    assert streamer.push(" <tool") == (" ", [])  # "<tool" may open <tool_call>
    assert streamer.push("s are fun") == ("<tools are fun", [])
    streamer = ToolCallStreamer(get_tool_parser("hermes"))
    assert streamer.push(f"<tool_call>{WEATHER}") == ("", [])  # inside a call: nothing until it closes
    content, calls = streamer.push("</tool_call>")
    assert content == "" and _calls(calls) == [WEATHER_CALL]


def test_call_ids_have_the_form_each_family_expects():
    assert get_tool_parser("hermes").new_call_id().startswith("chatcmpl-tool-")  # vLLM's form
    mistral_id = get_tool_parser("mistral").new_call_id()
    assert len(mistral_id) == 9 and mistral_id.isalnum()  # Mistral's templates refuse any other form
    assert get_tool_parser("mistral").keeps_special_tokens and not get_tool_parser("hermes").keeps_special_tokens


def test_parser_flags_are_checked_with_one_message_naming_the_flag():
    assert auto_tool_parser(False, None) is None
    assert auto_tool_parser(False, "hermes") is None  # a parser without the flag: "auto" stays off, as in vLLM
    assert auto_tool_parser(True, "llama3_json").name == "llama3_json"
    with pytest.raises(ValueError, match=r"--tool-call-parser must be one of hermes, llama3_json, mistral, openai; "
                                         r"got 'qwen'"):
        auto_tool_parser(True, "qwen")
    with pytest.raises(ValueError, match="--enable-auto-tool-choice requires --tool-call-parser"):
        auto_tool_parser(True, None)

"""Tool calling and reasoning over HTTP, with real clients (the openai SDK, langchain-openai): one live server
(`--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3`) over the tiny random model.

Two kinds of test, named for what they prove:
- `scripted`: the model's text is a script (tests/helpers/scripted_outputs.py), because a tiny random model never
  writes tool-call syntax; they prove the server's reading of such text, the response and stream shapes, and
  what the chat template was given;
- `model`: the engine generates; they prove the request reaches the template and the engine as it should, and,
  for tool_choice "required" / a named function, that structured outputs force calls that parse.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from starlette.testclient import TestClient

from tests.helpers.live_server import (
    MODEL,
    Served,
    serve,
    tiny_checkpoint,
    tiny_engine_args,
)
from tests.helpers.scripted_outputs import ScriptedOutputs
from vllm_jax.cli import build_parser, main
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.server.api_server import build_app
from vllm_jax.server.tool_choice import AUTO_NEEDS_FLAGS

# Prints what a tool-calling template is given: the tools, each call (arguments as the template sees them) and
# which call a tool result answers.
TOOL_TEMPLATE = (  # newlines as expressions: transformers renders with trim_blocks
    "{% if tools %}tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}{{ m['role'] }}:{% if m['content'] %} {{ m['content'] }}{% endif %}"
    "{% for c in m.get('tool_calls') or [] %} call {{ c['id'] }} {{ c['function']['name'] }}"
    "({{ c['function']['arguments'] | tojson }}){% endfor %}"
    "{% if m.get('tool_call_id') %} [for {{ m['tool_call_id'] }}]{% endif %}"
    "{% if m.get('reasoning_content') %} (thought: {{ m['reasoning_content'] }}){% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER_TOOL, TIME_TOOL]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}  # qwen3: the whole output is the answer
CALLS_TEXT = ('<think>I need the weather.</think>Checking.<tool_call>\n{"name": "get_weather", "arguments": '
              '{"city": "Paris"}}\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    checkpoint = tiny_checkpoint(tmp_path_factory.mktemp("tools"))
    # No whitespace between JSON tokens in forced outputs: a random model would pad a call with it forever.
    engine = AsyncLLM.from_engine_args(tiny_engine_args(checkpoint, max_model_len=256, reasoning_parser="qwen3",
                                                        structured_outputs_config={"disable_any_whitespace": True}))
    s = serve(engine, chat_template=TOOL_TEMPLATE, enable_auto_tool_choice=True, tool_call_parser="hermes")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def script(served: Served) -> ScriptedOutputs:
    return ScriptedOutputs(served.engine)


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="EMPTY", max_retries=0)


def _chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    kwargs = {"messages": ASK, "max_tokens": 8, **kwargs}
    return client.chat.completions.create(model=MODEL, **kwargs)


def _collect(chunks: Any) -> dict[str, Any]:
    """A stream's deltas put together the way clients do: text appended, tool calls merged by index."""
    out: dict[str, Any] = {"content": "", "reasoning": "", "calls": {}, "finish_reason": None, "roles": []}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            out["roles"].append(delta.role)
            out["content"] += delta.content or ""
            extra = delta.model_extra or {}
            assert extra.get("reasoning_content") == extra.get("reasoning")  # both names, every delta
            out["reasoning"] += extra.get("reasoning") or ""
            for piece in delta.tool_calls or []:
                call = out["calls"].setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = call["id"] or piece.id
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
            out["finish_reason"] = choice.finish_reason or out["finish_reason"]
    return out


def test_scripted_auto_calls_come_back_in_openais_shape_with_the_reasoning_apart(client: openai.OpenAI,
                                                                                 script: ScriptedOutputs):
    script.next(CALLS_TEXT)
    choice = _chat(client, tools=TOOLS).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    assert choice.message.model_extra["reasoning"] == "I need the weather."
    assert choice.message.model_extra["reasoning_content"] == "I need the weather."  # the earlier name too
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris"}), ("function", "get_time", {})]
    assert all(c.id.startswith("chatcmpl-tool-") for c in calls) and calls[0].id != calls[1].id


def test_scripted_stream_adds_up_to_the_same_answer_with_indexed_call_deltas(client: openai.OpenAI,
                                                                            script: ScriptedOutputs):
    script.next(CALLS_TEXT)
    got = _collect(_chat(client, tools=TOOLS, stream=True))
    assert got["roles"][0] == "assistant" and got["finish_reason"] == "tool_calls"
    assert (got["content"], got["reasoning"]) == ("Checking.", "I need the weather.")
    assert [(c["name"], json.loads(c["arguments"])) for c in got["calls"].values()] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert sorted(got["calls"]) == [0, 1] and all(c["id"].startswith("chatcmpl-tool-") for c in got["calls"].values())


def test_scripted_parallel_tool_calls_false_keeps_only_the_first_call(client: openai.OpenAI,
                                                                      script: ScriptedOutputs):
    script.next(CALLS_TEXT, CALLS_TEXT)
    message = _chat(client, tools=TOOLS, parallel_tool_calls=False).choices[0].message
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    streamed = _collect(_chat(client, tools=TOOLS, parallel_tool_calls=False, stream=True))
    assert [c["name"] for c in streamed["calls"].values()] == ["get_weather"]


def test_scripted_malformed_calls_and_tool_choice_none_stay_plain_content(client: openai.OpenAI,
                                                                          script: ScriptedOutputs, served: Served):
    malformed = "Let me see <tool_call>{get_weather: Paris}</tool_call>"
    script.next(malformed, malformed)
    choice = _chat(client, tools=TOOLS, extra_body=NO_THINKING).choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (malformed, [], "stop")
    streamed = _collect(_chat(client, tools=TOOLS, stream=True, extra_body=NO_THINKING))
    assert (streamed["content"], streamed["calls"], streamed["finish_reason"]) == (malformed, {}, "stop")
    well_formed = CALLS_TEXT.split("</think>")[1]
    script.next(well_formed)
    choice = _chat(client, tools=TOOLS, tool_choice="none", extra_body=NO_THINKING).choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (well_formed, [], "stop")
    assert script.last_prompt(served.engine.tokenizer).startswith("tools: get_weather get_time\n")  # still shown


def test_scripted_reasoning_is_apart_streamed_or_not_and_can_be_left_out(client: openai.OpenAI,
                                                                         script: ScriptedOutputs):
    thought = "<think>The user asks about Paris.</think>It is sunny."
    script.next(thought, thought, thought, thought)
    message = _chat(client).choices[0].message
    assert (message.content, message.model_extra["reasoning"]) == ("It is sunny.", "The user asks about Paris.")
    streamed = _collect(_chat(client, stream=True))
    assert (streamed["content"], streamed["reasoning"]) == ("It is sunny.", "The user asks about Paris.")
    message = _chat(client, extra_body={"include_reasoning": False}).choices[0].message
    assert (message.content, message.model_extra["reasoning"]) == ("It is sunny.", None)
    assert _chat(client, extra_body=NO_THINKING).choices[0].message.content == thought


def test_model_round_trip_renders_the_calls_and_results_of_earlier_turns(client: openai.OpenAI,
                                                                         script: ScriptedOutputs, served: Served):
    """The engine generates (a few random tokens); the check is what the template was given."""
    messages = [*ASK,
                {"role": "assistant", "content": None, "reasoning": "Use the tool.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]
    response = _chat(client, messages=messages, tools=TOOLS, max_tokens=3, extra_body=NO_THINKING)
    assert response.choices[0].finish_reason in ("stop", "length")
    assert script.last_prompt(served.engine.tokenizer) == (
        "tools: get_weather get_time\nuser: Weather in Paris?\n"
        'assistant: call call_1 get_weather({"city": "Paris"}) (thought: Use the tool.)\n'  # arguments as an object
        "tool: 18C [for call_1]\nassistant:")
    tokenized = httpx.post(f"{served.url}/tokenize", json={"model": MODEL, "messages": messages, "tools": TOOLS})
    assert tokenized.json()["tokens"] == script.requests[-1][0]  # /tokenize renders the same prompt


def test_scripted_langchain_bind_tools_round_trip_with_a_tool_message(served: Served, script: ScriptedOutputs):
    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "18C"

    llm = ChatOpenAI(base_url=f"{served.url}/v1", api_key="EMPTY", model=MODEL, max_tokens=8, max_retries=0,
                     extra_body=NO_THINKING).bind_tools([get_weather])
    script.next('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>')
    question = HumanMessage("Weather in Paris?")
    ai = llm.invoke([question])
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("get_weather", {"city": "Paris"})]
    call_id = ai.tool_calls[0]["id"]
    script.next("It is 18C in Paris.")
    answer = llm.invoke([question, ai, ToolMessage("18C", tool_call_id=call_id)])
    assert answer.content == "It is 18C in Paris." and answer.tool_calls == []
    prompt = script.last_prompt(served.engine.tokenizer)
    assert f'call {call_id} get_weather({{"city": "Paris"}})' in prompt and f"tool: 18C [for {call_id}]" in prompt
    script.next('Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>')
    merged = AIMessageChunk(content="")
    for chunk in llm.stream([question]):
        merged += chunk
    assert merged.content == "Sure." and [(c["name"], c["args"]) for c in merged.tool_calls] == [
        ("get_weather", {"city": "Rome"})]


def _calls_and_finish(response, stream: bool) -> tuple[list[tuple[str, str]], str | None]:
    """(name, arguments) of each call and the finish reason, from a response or its whole stream."""
    if stream:
        got = _collect(response)
        return [(c["name"], c["arguments"]) for c in got["calls"].values()], got["finish_reason"]
    choice = response.choices[0]
    return [(c.function.name, c.function.arguments) for c in choice.message.tool_calls], choice.finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_model_named_function_is_forced_by_structured_outputs(client: openai.OpenAI, script: ScriptedOutputs,
                                                              stream: bool):
    """The engine generates under the function's parameters schema; the arguments must parse into it. Thinking
    is on (qwen3): a constrained output without </think> is all answer."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    response = _chat(client, tools=TOOLS, tool_choice=named, max_tokens=40, temperature=0, stream=stream)
    params = script.requests[-1][1]
    assert params.structured_outputs.json == WEATHER_TOOL["function"]["parameters"]
    calls, finish = _calls_and_finish(response, stream)
    assert finish == "stop"  # OpenAI's answer for a named function
    assert [(name, json.loads(arguments)) for name, arguments in calls] in (
        [("get_weather", {"city": "Paris"})], [("get_weather", {"city": "Rome"})])


@pytest.mark.parametrize("stream", [False, True])
def test_model_required_is_forced_by_structured_outputs(client: openai.OpenAI, script: ScriptedOutputs,
                                                        stream: bool):
    """The engine generates under vLLM's list-of-calls schema; the calls must parse and name offered tools."""
    # Closing brackets first wherever the schema allows them (the enums leave no string they could go into): one
    # call, no extra keys, then the end.
    close_first = {str(3 + ord(c)): 20 for c in "}]"}  # tests/helpers/tiny_models.py: byte b is token 3 + b
    response = _chat(client, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0, stream=stream,
                     logit_bias=close_first)
    forced = script.requests[-1][1].structured_outputs
    assert forced.json["type"] == "array" and forced.disable_any_whitespace  # compact: the parser's input only
    calls, finish = _calls_and_finish(response, stream)
    assert finish == "tool_calls" and len(calls) == 1
    name, arguments = calls[0]
    assert name in ("get_weather", "get_time") and isinstance(json.loads(arguments), dict)


BAD_REQUESTS = [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_news"}}}, "tool_choice",
     "'get_news', which is not one of the tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools", "name"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "must be"),
    ({"tools": TOOLS, "tool_choice": 3}, "tool_choice", "must be"),
    ({"tools": []}, "tools", "must not be an empty list"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
     "cannot be combined with structured outputs"),
    *(({"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}], "tool_choice": choice},
       "tools", words)  # a forced choice compiles the tools' schemas: their errors name `tools`
      for choice, parameters, words in (("required", {"type": 5}, "invalid"), ("required", {"$defs": 3}, "$defs"),
                                        ({"type": "function", "function": {"name": "f"}}, {"type": 5}, "invalid"))),
    ({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages", "messages[0].tool_calls[0].function.arguments is not valid JSON"),
]


@pytest.mark.parametrize("extra,param,words", BAD_REQUESTS)
def test_bad_tool_input_is_a_400_naming_the_field(served: Served, extra: dict, param: str, words: str):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2, **extra}
    response = httpx.post(f"{served.url}/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def _app_client(served: Served, **tool_flags: Any) -> TestClient:
    """Another app over the same engine with other tool flags (its requests are validated or scripted, so the
    engine, which runs on the live server's event loop, is never asked to generate from this one)."""
    return TestClient(build_app(served.engine, served_model_names=[MODEL], api_key=None,
                                chat_template=TOOL_TEMPLATE, **tool_flags))


def test_auto_without_the_flags_is_vllms_400_and_none_still_works(served: Served, script: ScriptedOutputs):
    plain = _app_client(served)
    for extra in ({"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "auto"}):  # no tool_choice means "auto"
        response = plain.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, **extra})
        assert response.status_code == 400
        assert response.json()["error"]["message"] == AUTO_NEEDS_FLAGS == (
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
        assert response.json()["error"]["param"] == "tool_choice"
    script.next("Plain answer.")
    response = plain.post("/v1/chat/completions", json={
        "model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": "none", **NO_THINKING})
    assert response.json()["choices"][0]["message"]["content"] == "Plain answer."


def test_scripted_mistral_calls_keep_special_tokens_and_get_mistral_ids(served: Served, script: ScriptedOutputs):
    mistral = _app_client(served, enable_auto_tool_choice=True, tool_call_parser="mistral")
    script.next('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]')
    response = mistral.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "tools": TOOLS,
                                                          **NO_THINKING}).json()
    assert script.requests[-1][1].skip_special_tokens is False  # [TOOL_CALLS] is a special token in Mistral's
    (call,) = response["choices"][0]["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Rome"})
    assert len(call["id"]) == 9 and call["id"].isalnum()
    assert response["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("flags,message", [
    (["--enable-auto-tool-choice", "--tool-call-parser", "qwen"],
     "--tool-call-parser must be one of hermes, llama3_json, mistral, openai; got 'qwen'"),
    (["--enable-auto-tool-choice"], "--enable-auto-tool-choice requires --tool-call-parser")])
def test_serve_refuses_bad_tool_flags_before_loading_anything(capsys: pytest.CaptureFixture, flags: list[str],
                                                               message: str):
    assert main(["serve", "no/such/model", *flags]) == 2
    assert message in capsys.readouterr().err


def test_serve_takes_vllms_tool_flags():
    ns = build_parser().parse_args(["serve", "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"])
    assert (ns.enable_auto_tool_choice, ns.tool_call_parser) == (True, "llama3_json")
    assert build_parser().parse_args(["serve"]).enable_auto_tool_choice is False

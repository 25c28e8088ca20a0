"""/v1/responses over HTTP with the openai SDK and the openai-agents SDK: one live server (hermes tool parser, qwen3
reasoning parser) over the tiny random model.

As in test_tool_calling.py, `scripted` tests script the model's text (tests/helpers/scripted_outputs.py) and
prove the server's reading of it and the shapes it answers with; `model` tests let the engine generate (forced
tool calls and structured output parse because the grammar makes them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel
from starlette.testclient import TestClient

from tests.helpers.live_server import MODEL, Served, serve, tiny_checkpoint, tiny_engine_args
from tests.helpers.scripted_outputs import ScriptedOutputs
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.server.api_server import build_app

# Shows what the chat template is given: roles, content, calls (arguments as objects), results and reasoning.
TEMPLATE = (
    "{% if tools %}tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}{{ m['role'] }}:{% if m['content'] %} {{ m['content'] }}{% endif %}"
    "{% for c in m.get('tool_calls') or [] %} call {{ c['id'] }} {{ c['function']['name'] }}"
    "({{ c['function']['arguments'] | tojson }}){% endfor %}"
    "{% if m.get('tool_call_id') %} [for {{ m['tool_call_id'] }}]{% endif %}"
    "{% if m.get('reasoning_content') %} (thought: {{ m['reasoning_content'] }}){% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                          "required": ["city"], "additionalProperties": False}}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
CALL_TEXT = '<think>Hm.</think>Ok.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    checkpoint = tiny_checkpoint(tmp_path_factory.mktemp("responses"))
    engine = AsyncLLM.from_engine_args(tiny_engine_args(checkpoint, max_model_len=256, max_num_seqs=4,
                                                        reasoning_parser="qwen3",
                                                        structured_outputs_config={"disable_any_whitespace": True}))
    s = serve(engine, chat_template=TEMPLATE, enable_auto_tool_choice=True, tool_call_parser="hermes",
              responses_store_size=4)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def script(served: Served) -> ScriptedOutputs:
    return ScriptedOutputs(served.engine)


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="EMPTY", max_retries=0)


def _prompt(script: ScriptedOutputs, served: Served) -> str:
    return script.last_prompt(served.engine.tokenizer)


def test_scripted_string_input_with_instructions_gives_reasoning_and_a_message(
        client: openai.OpenAI, script: ScriptedOutputs, served: Served):
    script.next("<think>Paris is in France.</think>It is sunny.")
    response = client.responses.create(model=MODEL, input="Weather in Paris?", instructions="Be brief.",
                                       max_output_tokens=16, metadata={"k": "v"})
    assert _prompt(script, served) == "system: Be brief.\nuser: Weather in Paris?\nassistant:"
    assert (response.object, response.status, response.model, response.metadata) == (
        "response", "completed", MODEL, {"k": "v"})
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == "Paris is in France."
    assert response.output_text == "It is sunny."
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 < usage.output_tokens_details.reasoning_tokens <= usage.output_tokens


def test_scripted_item_input_renders_calls_results_and_reasoning_as_chat_does(
        client: openai.OpenAI, script: ScriptedOutputs, served: Served):
    script.next("18C it is.")
    items: list[Any] = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather"}, {"type": "input_text", "text": "?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Use the tool."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"}]
    response = client.responses.create(model=MODEL, input=items, tools=[WEATHER], max_output_tokens=8)
    assert _prompt(script, served) == (
        "tools: get_weather\nuser: Weather\n?\n"
        'assistant: call call_1 get_weather({"city": "Paris"}) (thought: Use the tool.)\n'
        "tool: 18C [for call_1]\nassistant:")
    assert response.output_text == "" and response.output[0].content[0].text == "18C it is."  # all reasoning: qwen3


def _events(stream: Any) -> list[Any]:
    with stream as events:
        return list(events)


def test_scripted_stream_sends_typed_events_in_order_whose_deltas_add_up(
        client: openai.OpenAI, script: ScriptedOutputs):
    script.next(CALL_TEXT)
    with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    compact = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert compact == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert (text, reasoning, json.loads(arguments)) == ("Ok.", "Hm.", {"city": "Paris"})
    assert final.output_text == "Ok."
    call = final.output[2]
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "get_weather", {"city": "Paris"})
    assert call.call_id.startswith("chatcmpl-tool-")


def test_scripted_auto_call_then_function_call_output_round_trip(client: openai.OpenAI, script: ScriptedOutputs,
                                                                 served: Served):
    script.next(CALL_TEXT, "<think>ok</think>Sunny, 18C.")
    first = client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER])
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[WEATHER], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "18C"}])
    assert second.output_text == "Sunny, 18C."
    assert _prompt(script, served).endswith(
        f'assistant: Ok. call {call.call_id} get_weather({{"city": "Paris"}}) (thought: Hm.)\n'
        f"tool: 18C [for {call.call_id}]\nassistant:")


def test_required_and_named_tool_choice_force_calls_that_parse(client: openai.OpenAI, script: ScriptedOutputs):
    """"required": the forced list of calls (a random model writes long lists: scripted); named: generated."""
    script.next('[{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "get_time", "parameters": {}}]')
    required = client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER, TIME], tool_choice="required")
    assert script.requests[-1][1].structured_outputs.json["type"] == "array"  # chat's forced schema
    assert [(c.type, c.name, json.loads(c.arguments)) for c in required.output] == [
        ("function_call", "get_weather", {"city": "Rome"}), ("function_call", "get_time", {})]
    named = client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER, TIME], max_output_tokens=64,
                                    tool_choice={"type": "function", "name": "get_weather"})
    call = named.output[-1]
    assert (call.type, call.name, json.loads(call.arguments)["city"] in ("Paris", "Rome")) == (
        "function_call", "get_weather", True)


class Forecast(BaseModel):
    city: Literal["Paris", "Rome"]
    sky: Literal["sunny", "rainy"]


def test_model_parse_with_a_pydantic_text_format(client: openai.OpenAI):
    parsed = client.responses.parse(model=MODEL, input="Forecast?", text_format=Forecast, max_output_tokens=64)
    assert isinstance(parsed.output_parsed, Forecast)


def test_scripted_previous_response_id_carries_three_turns_and_store_routes(
        client: openai.OpenAI, script: ScriptedOutputs, served: Served):
    script.next("<think>a</think>One.", "<think>b</think>Two.", "<think>c</think>Three.")
    first = client.responses.create(model=MODEL, input="First?", instructions="Only for turn one.")
    second = client.responses.create(model=MODEL, input="Second?", previous_response_id=first.id)
    third = client.responses.create(model=MODEL, input="Third?", previous_response_id=second.id)
    assert _prompt(script, served) == (  # instructions do not carry over, as in OpenAI's API
        "user: First?\nassistant: One. (thought: a)\nuser: Second?\nassistant: Two. (thought: b)\n"
        "user: Third?\nassistant:")
    assert third.output_text == "Three." and third.previous_response_id == second.id
    assert client.responses.retrieve(first.id).output_text == "One."
    with pytest.raises(openai.BadRequestError, match="only a response in progress"):
        client.responses.cancel(first.id)
    client.responses.delete(first.id)
    for call in (lambda: client.responses.retrieve(first.id), lambda: client.responses.delete(first.id),
                 lambda: client.responses.create(model=MODEL, input="x", previous_response_id=first.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    script.next("x")
    unstored = client.responses.create(model=MODEL, input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"tools": [{"type": "web_search"}]}, "tools", "web_search"),
    ({"background": True}, "background", "background"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input",
     "does not accept image inputs"),  # a text model (docs/serving.md, "Images")
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input", "input_file"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input", "item_reference"),
    ({"input": ""}, "input", "must not be empty"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format", "yaml"),
    ({"tool_choice": {"type": "file_search"}, "tools": [WEATHER]}, "tool_choice", "file_search"),
    ({"max_output_tokens": 100_000}, "max_output_tokens", "context length"),
    ({"include": ["message.output_text.logprobs"]}, "include", "logprobs"),
])
def test_unsupported_fields_and_bad_input_are_400s_naming_the_field(served: Served, body: dict, param: str,
                                                                     words: str):
    response = httpx.post(f"{served.url}/v1/responses", json={"model": MODEL, "input": "hi", **body}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_without_a_store_previous_response_id_is_a_400_and_the_routes_take_the_api_key(served: Served):
    app = build_app(served.engine, served_model_names=[MODEL], api_key="sk-test", chat_template=TEMPLATE,
                    responses_store_size=0)  # --disable-responses-store
    with TestClient(app) as http:
        assert http.get("/v1/responses/resp_1").status_code == 401
        assert http.post("/v1/responses", json={"model": MODEL, "input": "hi"}).status_code == 401
        http.headers["Authorization"] = "Bearer sk-test"
        refused = http.post("/v1/responses", json={"model": MODEL, "input": "hi", "previous_response_id": "resp_1"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "previous_response_id"
        assert http.get("/v1/responses/resp_1").status_code == 404


def test_model_greedy_output_equals_the_same_conversation_through_chat_completions(client: openai.OpenAI,
                                                                                   script: ScriptedOutputs):
    kwargs: dict[str, Any] = {"temperature": 0, "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    response = client.responses.create(model=MODEL, input="Hello", instructions="Be kind.", max_output_tokens=8,
                                       **kwargs)
    responses_prompt = script.requests[-1][0]
    chat = client.chat.completions.create(model=MODEL, max_tokens=8, messages=[
        {"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hello"}], **kwargs)
    assert script.requests[-1][0] == responses_prompt
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")


def test_model_stream_hang_up_and_cancel_abort_the_engine_request(client: openai.OpenAI, served: Served,
                                                                   monkeypatch: pytest.MonkeyPatch):
    generate = served.engine.generate

    async def slowly(prompt: Any, params: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """Without EOS and slowly: a tiny model would finish before the cancel."""
        async for out in generate(prompt, dataclasses.replace(params, ignore_eos=True), *args, **kwargs):
            await asyncio.sleep(0.02)
            yield out

    monkeypatch.setattr(served.engine, "generate", slowly)
    with client.responses.stream(model=MODEL, input="Go on", max_output_tokens=200) as stream:
        created = next(iter(stream))
        assert client.responses.retrieve(created.response.id).status == "in_progress"
        assert client.responses.cancel(created.response.id).status == "cancelled"
        kinds = [e.type for e in stream]
    assert kinds[-1] == "response.incomplete"
    assert client.responses.retrieve(created.response.id).status == "cancelled"
    served.assert_idle()
    with client.responses.stream(model=MODEL, input="Go on", max_output_tokens=200) as stream:
        next(iter(stream))  # hang up after the first event
    served.assert_idle()


def test_model_openai_agents_sdk_completes_a_tool_round_trip(served: Served, script: ScriptedOutputs):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """The weather in a city."""
        seen.append(city)
        script.next("<think>done</think>It is 18C.")  # the agent's next turn
        return "18C"

    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=openai.AsyncOpenAI(
        base_url=f"{served.url}/v1", api_key="EMPTY", max_retries=0))
    agent = agents.Agent(name="weather", instructions="Answer with the tool.", tools=[get_weather], model=model,
                         model_settings=agents.ModelSettings(tool_choice="required"))
    # tool_choice "required": the forced list of calls (scripted, as above); then the agent's answer
    script.next('[{"name": "get_weather", "parameters": {"city": "Paris"}}]')
    result = agents.Runner.run_sync(agent, "Weather in Paris?", max_turns=3)
    assert seen == ["Paris"]
    assert result.final_output == "It is 18C."

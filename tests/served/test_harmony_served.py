"""gpt-oss's harmony format over HTTP with the openai SDK: one live server over a tiny random GptOssForCausalLM
(`--reasoning-parser openai_gptoss --enable-auto-tool-choice --tool-call-parser openai`), whose tokenizer has
harmony's special tokens and whose own chat template renders harmony (a minimal one written here: the real one
ships in openai/gpt-oss's tokenizer_config, which the offline suite cannot fetch).

As in test_tool_calling.py, `scripted` tests script the model's text (tests/helpers/scripted_outputs.py): they
prove the server's reading of what gpt-oss writes (analysis / commentary / final channels) on chat completions
and /v1/responses, whole and streamed, and what the template is given; the `model` test lets the engine generate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.helpers.live_server import MODEL, Served, serve, tiny_engine_args
from tests.helpers.scripted_outputs import ScriptedOutputs
from tests.helpers.tiny_models import EOS_ID, byte_tokenizer, make_tiny_checkpoint
from vllm_jax.engine.async_llm import AsyncLLM

SPECIAL = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
# harmony, reduced: a developer message listing the tools, the turns in their channels, the generation prompt
# `<|start|>assistant` (gpt-oss writes its first message's channel itself). Newlines only inside text.
TEMPLATE = (
    "{%- set ns = namespace(name='') -%}"
    "{%- if tools -%}<|start|>developer<|message|># Tools\n{% for t in tools %}{{ t['function']['name'] }} "
    "{% endfor %}<|end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] in ('system', 'developer') -%}<|start|>developer<|message|>{{ m['content'] }}<|end|>"
    "{%- elif m['role'] == 'user' -%}<|start|>user<|message|>{{ m['content'] }}<|end|>"
    "{%- elif m['role'] == 'assistant' -%}"
    "{%- if m.get('reasoning_content') -%}<|start|>assistant<|channel|>analysis<|message|>"
    "{{ m['reasoning_content'] }}<|end|>{%- endif -%}"
    "{%- for c in m.get('tool_calls') or [] -%}{%- set ns.name = c['function']['name'] -%}"
    "<|start|>assistant to=functions.{{ ns.name }}<|channel|>commentary <|constrain|>json<|message|>"
    "{{ c['function']['arguments'] | tojson }}<|call|>{%- endfor -%}"
    "{%- if m['content'] -%}<|start|>assistant<|channel|>final<|message|>{{ m['content'] }}<|end|>{%- endif -%}"
    "{%- elif m['role'] == 'tool' -%}<|start|>functions.{{ ns.name }} to=assistant<|channel|>commentary"
    "<|message|>{{ m['content'] }}<|end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}")
WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
ASK = [{"role": "user", "content": "Weather?"}]
ANSWER = ("<|channel|>analysis<|message|>The user asks the weather.<|end|>"
          "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>")
CALL = ("<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')
DIRECT_CALL = ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Rome"}'


def harmony_checkpoint(path: Path) -> Path:
    """The tiny random gpt-oss, its byte tokenizer with harmony's special tokens (ids 285..291 of its 320) and the
    template above; `<|return|>` and `<|call|>` stop generation, as gpt-oss's generation_config says."""
    make_tiny_checkpoint("gpt_oss", path)
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    stops = [EOS_ID, *tokenizer.convert_tokens_to_ids(["<|return|>", "<|call|>"])]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    checkpoint = harmony_checkpoint(tmp_path_factory.mktemp("harmony") / "gpt-oss")
    engine = AsyncLLM.from_engine_args(tiny_engine_args(checkpoint, max_model_len=256, max_num_seqs=4,
                                                        reasoning_parser="openai_gptoss"))
    s = serve(engine, chat_template=None, enable_auto_tool_choice=True, tool_call_parser="openai")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def script(served: Served) -> ScriptedOutputs:
    return ScriptedOutputs(served.engine)


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="EMPTY", max_retries=0)


def _chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(model=MODEL, **{"messages": ASK, "max_tokens": 8, **kwargs})


def _collect(chunks: Any) -> dict[str, Any]:
    """A chat stream's deltas put together: text appended, tool calls merged by index."""
    out: dict[str, Any] = {"content": "", "reasoning": "", "calls": {}, "finish_reason": None}
    for chunk in chunks:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            assert extra.get("reasoning_content") == extra.get("reasoning")  # both names, every delta
            out["content"] += choice.delta.content or ""
            out["reasoning"] += extra.get("reasoning") or ""
            for piece in choice.delta.tool_calls or []:
                call = out["calls"].setdefault(piece.index, {"name": "", "arguments": ""})
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
            out["finish_reason"] = choice.finish_reason or out["finish_reason"]
    return out


def test_scripted_chat_analysis_and_final_channels_are_reasoning_and_content_whole_and_streamed(
        client: openai.OpenAI, script: ScriptedOutputs, served: Served):
    script.next(ANSWER, ANSWER)
    choice = _chat(client).choices[0]
    prompt_ids, params = script.requests[-1]
    tokenizer = served.engine.tokenizer
    assert tokenizer.decode(prompt_ids) == "<|start|>user<|message|>Weather?<|end|><|start|>assistant"
    assert prompt_ids[:3] == tokenizer.convert_tokens_to_ids(["<|start|>", "u", "s"])  # a marker is one token
    assert params.skip_special_tokens is False  # the markers reach the parsers
    assert (choice.message.content, choice.finish_reason) == ("It is sunny.", "stop")
    extra = choice.message.model_extra
    assert extra["reasoning"] == extra["reasoning_content"] == "The user asks the weather."
    got = _collect(_chat(client, stream=True))
    assert (got["reasoning"], got["content"], got["finish_reason"]) == ("The user asks the weather.", "It is sunny.",
                                                                       "stop")


def test_scripted_chat_commentary_calls_are_tool_calls_whole_and_streamed_and_render_back(
        client: openai.OpenAI, script: ScriptedOutputs, served: Served):
    script.next(CALL, CALL, DIRECT_CALL)
    choice = _chat(client, tools=CHAT_TOOLS).choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    assert choice.message.model_extra["reasoning"] == "Use the tool."
    call = choice.message.tool_calls[0]
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function", "get_weather", {"city": "Paris"})
    got = _collect(_chat(client, tools=CHAT_TOOLS, stream=True))
    assert (got["reasoning"], got["content"], got["finish_reason"]) == ("Use the tool.", "", "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in got["calls"].values()] == [
        ("get_weather", {"city": "Paris"})]
    direct = _chat(client, tools=CHAT_TOOLS).choices[0].message  # no analysis, the recipient before the channel
    assert (direct.content, direct.model_extra.get("reasoning")) == (None, None)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in direct.tool_calls] == [
        ("get_weather", {"city": "Rome"})]
    # tool_choice "required": the grammar starts after the analysis's <|end|> (the reasoning gate), so the
    # constrained list follows it with no header
    script.next('<|channel|>analysis<|message|>Hm.<|end|>[{"name": "get_weather", "parameters": {"city": "Rome"}}]')
    forced = _chat(client, tools=CHAT_TOOLS, tool_choice="required").choices[0].message
    assert (forced.content, forced.model_extra["reasoning"]) == (None, "Hm.")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in forced.tool_calls] == [
        ("get_weather", {"city": "Rome"})]
    script.next("<|channel|>final<|message|>18C.")
    history = [*ASK, {"role": "assistant", "content": None, "reasoning": "Use the tool.",
                      "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "18C"}]
    answer = _chat(client, messages=history, tools=CHAT_TOOLS).choices[0].message
    assert (answer.content, answer.model_extra.get("reasoning")) == ("18C.", None)
    assert served.engine.tokenizer.decode(script.requests[-1][0]) == (
        "<|start|>developer<|message|># Tools\nget_weather <|end|><|start|>user<|message|>Weather?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Use the tool.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>'
        '{"city": "Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>18C<|end|><|start|>assistant")


def test_scripted_responses_give_reasoning_message_and_function_call_items(client: openai.OpenAI,
                                                                          script: ScriptedOutputs):
    script.next(ANSWER, CALL)
    answer = client.responses.create(model=MODEL, input="Weather?", max_output_tokens=8)
    assert [item.type for item in answer.output] == ["reasoning", "message"]
    assert answer.output[0].content[0].text == "The user asks the weather."
    assert answer.output_text == "It is sunny."
    assert 0 < answer.usage.output_tokens_details.reasoning_tokens <= answer.usage.output_tokens
    called = client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER], max_output_tokens=8)
    assert [item.type for item in called.output] == ["reasoning", "function_call"]
    call = called.output[1]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert called.output_text == ""


def _streamed(client: openai.OpenAI, **kwargs: Any) -> tuple[list[Any], Any]:
    with client.responses.stream(model=MODEL, input="Weather?", max_output_tokens=8, **kwargs) as stream:
        return list(stream), stream.get_final_response()


def _compact(events: list[Any]) -> list[str]:
    kinds = [e.type for e in events]
    return [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]


def test_scripted_responses_stream_typed_events_whose_deltas_add_up(client: openai.OpenAI, script: ScriptedOutputs):
    script.next(ANSWER, CALL)
    events, final = _streamed(client)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    reasoning_item = ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                      "response.reasoning_text.done", "response.content_part.done", "response.output_item.done"]
    assert _compact(events) == [
        "response.created", "response.in_progress", *reasoning_item,
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert (reasoning, text, final.output_text) == ("The user asks the weather.", "It is sunny.", "It is sunny.")
    events, final = _streamed(client, tools=[WEATHER])
    assert _compact(events) == [
        "response.created", "response.in_progress", *reasoning_item,
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(arguments) == {"city": "Paris"}
    assert [(item.type, getattr(item, "name", None)) for item in final.output] == [
        ("reasoning", None), ("function_call", "get_weather")]


def test_model_gpt_oss_generates_through_the_harmony_parsers(client: openai.OpenAI):
    """The tiny random gpt-oss itself (no script): its text, special tokens kept, goes through both parsers."""
    choice = _chat(client, tools=CHAT_TOOLS, max_tokens=6, temperature=0.0).choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    response = client.responses.create(model=MODEL, input="Weather?", max_output_tokens=6, temperature=0.0)
    assert response.status in ("completed", "incomplete") and response.usage.output_tokens <= 6

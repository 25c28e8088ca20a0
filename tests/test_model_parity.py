"""Our decoder against transformers (PyTorch CPU, float32) on the same tiny random weights."""

from __future__ import annotations

import numpy as np
import pytest

from tests.parity import assert_logits_match_over_two_chunked_steps, ragged_sequences
from tests.tiny_models import ARCHS, VOCAB_SIZE, hf_greedy, make_tiny_checkpoint


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_logits_match_transformers_on_ragged_chunked_batches(arch, tmp_path):
    """Four sequences of different lengths, each split into two chunks over two steps (the second step reads
    the first step's KV from the pages), mixed with a decode-sized row: every computed position's logits
    match transformers within 1e-4."""
    hf = make_tiny_checkpoint(arch, tmp_path)
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences())


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_greedy_continuation_of_32_tokens_is_token_identical(arch, tmp_path):
    from vllm_jax import SamplingParams
    from vllm_jax.llm import LLM

    hf = make_tiny_checkpoint(arch, tmp_path, seed=3)
    llm = LLM(str(tmp_path), max_model_len=128, num_gpu_blocks_override=64, block_size=8, max_num_seqs=8,
              max_num_batched_tokens=32)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, VOCAB_SIZE, n).tolist() for n in (7, 30, 1)]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 32)
        assert out.outputs[0].finish_reason == "length"

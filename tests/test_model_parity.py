"""Our decoder against transformers (PyTorch CPU, float32) on the same tiny random weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from tests.tiny_models import ARCHS, VOCAB_SIZE, hf_greedy, make_tiny_checkpoint
from vllm_jax.model.batch import RowChunk, pack_step_inputs
from vllm_jax.model.loader import build_model
from vllm_jax.model.registry import resolve_architecture
from vllm_jax.model.source import load_hf_config, resolve_model_source

BLOCK_SIZE = 4
MAX_BLOCKS = 16


def _load(path):
    source = resolve_model_source(str(path))
    entry, spec = resolve_architecture(load_hf_config(source))
    model = build_model(entry, spec, "float32", source)
    graphdef, params = nnx.split(model)
    forward = jax.jit(lambda p, kv, x: nnx.merge(graphdef, p)(kv, x), donate_argnums=1)
    kv = jnp.zeros((spec.num_layers, 64, BLOCK_SIZE, 2 * spec.num_kv_heads, spec.head_dim), jnp.float32)
    return spec, params, forward, kv


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_logits_match_transformers_on_ragged_chunked_batches(arch, tmp_path):
    """Four sequences of different lengths, each split into two chunks over two steps (the second step reads
    the first step's KV from the pages), mixed with a decode-sized row: every computed position's logits
    match transformers within 1e-4."""
    hf = make_tiny_checkpoint(arch, tmp_path)
    spec, params, forward, kv = _load(tmp_path)
    rng = np.random.default_rng(1)
    seqs = [rng.integers(3, VOCAB_SIZE, n).tolist() for n in (5, 23, 2, 14)]
    splits = [3, 11, 1, 13]
    blocks, next_block = [], 1
    for s in seqs:
        n = -(-len(s) // BLOCK_SIZE)
        blocks.append(list(range(next_block, next_block + n)))
        next_block += n

    def run(rows):
        inputs = pack_step_inputs(rows, block_size=BLOCK_SIZE, max_blocks_per_seq=MAX_BLOCKS,
                                  num_tokens_padded=32, num_seqs_padded=8)
        nonlocal kv
        kv, logits = forward(params, kv, inputs)
        return np.asarray(logits)

    first = run([RowChunk(s[:c], 0, b) for s, c, b in zip(seqs, splits, blocks)])
    second = run([RowChunk(s[c:], c, b) for s, c, b in zip(seqs, splits, blocks)])
    for i, (seq, cut) in enumerate(zip(seqs, splits)):
        with torch.no_grad():
            ref = hf(torch.tensor([seq])).logits[0].numpy()
        assert np.abs(ref).max() > 0.1, "reference logits too small for a meaningful comparison"
        np.testing.assert_allclose(first[i], ref[cut - 1], atol=1e-4, rtol=0)
        np.testing.assert_allclose(second[i], ref[-1], atol=1e-4, rtol=0)


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

"""Shared transformers-parity check: our forward on a ragged batch split into two chunked steps."""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from tests.helpers.tiny_models import VOCAB_SIZE
from vllm_jax.model.decoder import forward
from vllm_jax.model.layers import unstack_layers
from vllm_jax.model.state_cache import HybridCache
from vllm_jax.model_loader.loader import build_model
from vllm_jax.model_loader.source import load_hf_config, resolve_model_source
from vllm_jax.models.registry import resolve_architecture
from vllm_jax.worker.batch import RowChunk, pack_step_inputs

BLOCK_SIZE = 4
MAX_BLOCKS = 16
SEQ_LENS = (5, 23, 2, 14)
SPLITS = (3, 11, 1, 13)
STATE_SLOTS = 9  # a hybrid model's state slots in load_forward's cache: the null slot and one per row of 8


def load_forward(path, layers: str = "stacked", attention_backend: str = "auto"):
    """(spec, params, jitted forward(params, kv, inputs), zeroed KV cache) for a checkpoint directory.

    `layers`: "stacked" (the scan over stacked params, as on TPU), "switched" (the scan over per-layer arrays, as
    on CPU) or "unrolled" (--no-scan-layers, as on GPU). `attention_backend`: a Pallas one runs in interpret
    mode on CPU."""
    source = resolve_model_source(str(path))
    entry, spec = resolve_architecture(load_hf_config(source))
    model = build_model(entry, spec, "float32", source, attention_backend=attention_backend)
    model.scan_layers = layers != "unrolled"
    graphdef, params = nnx.split(model)
    if layers != "stacked":
        unstack_layers(params)
    forward_step = jax.jit(partial(forward, graphdef), donate_argnums=1)
    kv = jnp.zeros((spec.num_cache_layers, 64, BLOCK_SIZE, spec.kv_cache_heads, spec.kv_cache_width), jnp.float32)
    layout = spec.state_layout
    if layout is not None:  # a hybrid model: state slots beside the blocks (row i of a step uses slot i + 1)
        kv = HybridCache(kv, jnp.zeros((layout.num_layers, STATE_SLOTS, *layout.conv_shape), jnp.float32),
                         jnp.zeros((layout.num_layers, STATE_SLOTS, *layout.recurrent_shape), jnp.float32))
    return spec, params, forward_step, kv


def pack_rows(rows: list[RowChunk], kv, num_tokens_padded: int = 32, num_seqs_padded: int = 8):
    """The step inputs of `rows` for load_forward's cache: a hybrid model's rows take state slots 1, 2, ... in order
    (unless a row names its own)."""
    hybrid = isinstance(kv, HybridCache)
    if hybrid:
        rows = [row if row.state_slot else dataclasses.replace(row, state_slot=i + 1) for i, row in enumerate(rows)]
    return pack_step_inputs(rows, block_size=BLOCK_SIZE, max_blocks_per_seq=MAX_BLOCKS,
                            num_tokens_padded=num_tokens_padded, num_seqs_padded=num_seqs_padded, state_slots=hybrid)


def ragged_sequences(seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB_SIZE, n).tolist() for n in SEQ_LENS]


def assert_logits_match_over_two_chunked_steps(hf, path, seqs: list[list[int]], layers: str = "stacked",
                                               attention_backend: str = "auto") -> None:
    """Each sequence is split in two chunks computed in two steps (the second reads the first's KV from the
    pages), mixed with a decode-sized row: every computed position's logits match transformers within 1e-4."""
    _, params, forward, kv = load_forward(path, layers, attention_backend)
    blocks, next_block = [], 1
    for s in seqs:
        n = -(-len(s) // BLOCK_SIZE)
        blocks.append(list(range(next_block, next_block + n)))
        next_block += n

    def run(rows):
        nonlocal kv
        kv, logits = forward(params, kv, pack_rows(rows, kv))
        return np.asarray(logits)

    first = run([RowChunk(s[:c], 0, b) for s, c, b in zip(seqs, SPLITS, blocks)])
    second = run([RowChunk(s[c:], c, b) for s, c, b in zip(seqs, SPLITS, blocks)])
    for i, (seq, cut) in enumerate(zip(seqs, SPLITS)):
        with torch.no_grad():
            ref = hf(torch.tensor([seq])).logits[0].numpy()
        assert np.abs(ref).max() > 0.1, "reference logits too small for a meaningful comparison"
        np.testing.assert_allclose(first[i], ref[cut - 1], atol=1e-4, rtol=0)
        np.testing.assert_allclose(second[i], ref[-1], atol=1e-4, rtol=0)


def assert_greedy_matches_transformers(hf, path, max_tokens: int = 32) -> None:
    """Prompts of 7, 30 and 1 tokens through LLM.generate: greedy continuations token-identical to HF's."""
    from tests.helpers.tiny_models import hf_greedy
    from vllm_jax import LLM, SamplingParams

    llm = LLM(str(path), max_model_len=128, num_gpu_blocks_override=64, block_size=8, max_num_seqs=8,
              max_num_batched_tokens=32, min_token_bucket=32, min_seq_bucket=8)  # one bucket: one forward compiles
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, VOCAB_SIZE, n).tolist() for n in (7, 30, 1)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for prompt, out in zip(prompts, llm.generate(prompts, params, use_tqdm=False)):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, max_tokens)
        assert out.outputs[0].finish_reason == "length"

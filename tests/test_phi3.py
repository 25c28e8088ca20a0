"""Phi-3's LongRoPE against transformers past the original context, and its spec's checks. (Within the original
context, Phi-3 runs the family parity and engine tests in tests/test_families.py.)"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoConfig

from tests.helpers.family_models import PHI3_ORIGINAL_CONTEXT, make_family_checkpoint
from tests.helpers.tiny_models import VOCAB_SIZE
from vllm_jax.model.decoder import forward
from vllm_jax.model.phi3 import phi3_spec_from_hf_config
from vllm_jax.model.registry import resolve_architecture
from vllm_jax.model_loader.loader import build_model
from vllm_jax.model_loader.source import load_hf_config, resolve_model_source
from vllm_jax.worker.batch import RowChunk, pack_step_inputs

BLOCK = 8
CUTS = (0, 50, 70, 100)  # a 100-token sequence in three chunked steps; positions 49 (< original 64), 69, 99


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    path = tmp_path_factory.mktemp("phi3")
    return path, make_family_checkpoint("phi3", path, seed=4)


def _chunked_logits(path, max_model_len: int, seq: list[int]) -> np.ndarray:
    """Our logits at the last token of each chunk of `seq` (CUTS), the chunks run as successive steps over the
    paged KV cache, by an engine serving `max_model_len` tokens."""
    source = resolve_model_source(str(path))
    entry, spec = resolve_architecture(load_hf_config(source), max_model_len)
    graphdef, params = nnx.split(build_model(entry, spec, "float32", source))
    step = jax.jit(partial(forward, graphdef), donate_argnums=1)
    kv = jnp.zeros((spec.num_layers, 32, BLOCK, 2 * spec.num_kv_heads, spec.head_dim), jnp.float32)
    blocks = list(range(1, 1 + -(-len(seq) // BLOCK)))
    out = []
    for start, stop in zip(CUTS, CUTS[1:]):
        inputs = pack_step_inputs([RowChunk(seq[start:stop], start, blocks)], block_size=BLOCK,
                                  max_blocks_per_seq=16, num_tokens_padded=64, num_seqs_padded=2)
        kv, logits = step(params, kv, inputs)
        out.append(np.asarray(logits)[0])
    return np.stack(out)


def test_long_context_engine_matches_transformers_one_forward_past_the_original_context(phi3):
    """A 100-token sequence (original context 64) run in one forward by transformers uses the long factors at
    every position; an engine serving 256 tokens uses them for every token, so its chunked logits match at
    positions before and after 64. The short-factor engine (max_model_len 64) does not: the sets differ."""
    path, hf = phi3
    seq = np.random.default_rng(5).integers(3, VOCAB_SIZE, CUTS[-1]).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0].numpy()[[c - 1 for c in CUTS[1:]]]
    np.testing.assert_allclose(_chunked_logits(path, 256, seq), ref, atol=1e-4, rtol=0)
    assert np.abs(_chunked_logits(path, PHI3_ORIGINAL_CONTEXT, seq) - ref).max() > 1e-2


def test_spec_carries_both_factor_sets_and_the_attention_factor(phi3):
    path, _ = phi3
    config = AutoConfig.from_pretrained(path)
    spec = phi3_spec_from_hf_config(config)
    assert spec.rope_original_max_position == PHI3_ORIGINAL_CONTEXT and len(spec.long_inv_freq) == 8
    assert spec.rope_attention_scaling == pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))
    _, short = resolve_architecture(config, PHI3_ORIGINAL_CONTEXT)
    _, long = resolve_architecture(config, PHI3_ORIGINAL_CONTEXT + 1)
    assert short.inv_freq == spec.inv_freq and long.inv_freq == spec.long_inv_freq != spec.inv_freq


@pytest.mark.parametrize("change, message", [
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(long_factor=[1.0] * 3), "long_factor has 3 entries"),
])
def test_unsupported_rope_settings_are_named(phi3, change, message):
    config = AutoConfig.from_pretrained(phi3[0])
    config.rope_parameters = {**config.rope_parameters, **change}
    with pytest.raises(ValueError, match=message):
        phi3_spec_from_hf_config(config)

"""Phi-3's LongRoPE against transformers past the original context, its spec's checks, and Phi-3's
head_dim-not-a-power-of-two (96 in Phi-3-mini; 24 here) through the pallas_gpu kernels. (Within the original
context, Phi-3 runs the family parity and engine tests in tests/engine/test_families.py.)"""

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


def _chunked_logits(path, max_model_len: int, seq: list[int], attention_backend: str = "auto") -> np.ndarray:
    """Our logits at the last token of each chunk of `seq` (CUTS), the chunks run as successive steps over the
    paged KV cache, by an engine serving `max_model_len` tokens."""
    source = resolve_model_source(str(path))
    entry, spec = resolve_architecture(load_hf_config(source), max_model_len)
    graphdef, params = nnx.split(build_model(entry, spec, "float32", source, attention_backend=attention_backend))
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


# head_dim 24 (hidden 96, 4 query / 2 KV heads): not a power of two, as Phi-3-mini's 96 is not; LongRoPE factors
# for its 12 rotary frequency pairs
HD24 = dict(hidden_size=96, rope_scaling={"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(12)],
                                          "long_factor": [1.0 + 1.5 * i for i in range(12)]})


@pytest.fixture(scope="module")
def phi3_hd24(tmp_path_factory):
    path = tmp_path_factory.mktemp("phi3_hd24")
    return path, make_family_checkpoint("phi3", path, seed=6, **HD24)


def test_head_dim_24_through_the_pallas_gpu_kernels_matches_xla_and_transformers(phi3_hd24):
    """Chunked prefill steps (the KV write and the attention kernel, interpret mode) at head_dim 24: pallas_gpu's
    logits equal the xla backend's, and both match transformers."""
    path, hf = phi3_hd24
    assert hf.config.hidden_size // hf.config.num_attention_heads == 24
    seq = np.random.default_rng(7).integers(3, VOCAB_SIZE, CUTS[-1]).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0].numpy()[[c - 1 for c in CUTS[1:]]]
    xla = _chunked_logits(path, 256, seq, "xla")
    gpu = _chunked_logits(path, 256, seq, "pallas_gpu")
    np.testing.assert_allclose(xla, ref, atol=1e-4, rtol=0)
    np.testing.assert_allclose(gpu, xla, atol=2e-5, rtol=0)


def test_head_dim_24_engine_on_pallas_gpu_gives_the_xla_backends_tokens_and_logprobs(phi3_hd24):
    """The whole engine (chunked prefill in 16-token steps, decode rows, padding) through pallas_gpu in interpret
    mode: the same greedy tokens and top-5 logprobs at every step as with the xla backend."""
    from vllm_jax import LLM, SamplingParams

    path, _ = phi3_hd24
    rng = np.random.default_rng(8)
    prompts = [rng.integers(3, VOCAB_SIZE, int(n)).tolist() for n in (5, 23, 40)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=5)
    runs = {}
    for backend in ("xla", "pallas_gpu"):
        llm = LLM(str(path), attention_backend=backend, max_model_len=128, block_size=8, num_gpu_blocks_override=32,
                  max_num_seqs=4, max_num_batched_tokens=16, min_token_bucket=16, min_seq_bucket=4)
        runs[backend] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    for want, got in zip(runs["xla"], runs["pallas_gpu"]):
        assert list(got.token_ids) == list(want.token_ids) and len(want.token_ids) == 6
        for w, g in zip(want.logprobs, got.logprobs):
            assert w.keys() == g.keys()
            np.testing.assert_allclose([g[t].logprob for t in w], [w[t].logprob for t in w], atol=2e-5)

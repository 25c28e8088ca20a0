"""Gemma 2 and Gemma 3 (text) against transformers on tiny random checkpoints: logits on ragged chunked batches,
32-token greedy continuations, prefix caching and preemption invariance, and the config options
refused (TP 2: tests/multidevice/test_gemma_tp.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.family_checks import engine_greedy
from tests.helpers.parity import assert_logits_match_over_two_chunked_steps, load_forward, ragged_sequences
from tests.helpers.tiny_models import VOCAB_SIZE, hf_greedy, make_tiny_checkpoint
from vllm_jax.model.gemma_spec import gemma_spec_from_hf_config

MAX_TOKENS = 32


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, make_tiny_checkpoint(request.param, path, seed=3)


def test_spec_reads_the_gemma_switches(checkpoint):
    arch, path, hf = checkpoint
    spec = load_forward(path)[0]
    assert spec.architecture == hf.config.architectures[0]
    assert spec.sliding_windows == (6, 0)
    assert spec.embedding_multiplier == pytest.approx(8.0) and spec.sm_scale == pytest.approx(24 ** -0.5)
    assert spec.final_soft_cap == 3.0
    if arch == "gemma2":  # one rope; attention logits capped
        assert spec.attention_soft_cap == 1.5 and not spec.separate_local_rope and not spec.qk_norm
    else:  # transformers' Gemma 3 attention never applies attn_logit_softcapping; local rope base 10k, global 1M / 4
        assert spec.attention_soft_cap is None and spec.separate_local_rope and spec.qk_norm
        assert spec.local_inv_freq[1] == pytest.approx(10000.0 ** (-2 / 32))
        assert spec.inv_freq[1] == pytest.approx(1e6 ** (-2 / 32) / 4.0)


def test_logits_match_transformers_on_ragged_chunked_batches(checkpoint):
    """Gemma 2 through the stacked scan, Gemma 3 through the switched per-layer scan (the CPU default)."""
    arch, path, hf = checkpoint
    assert_logits_match_over_two_chunked_steps(hf, path, ragged_sequences(),
                                               layers="stacked" if arch == "gemma2" else "switched")


def test_attention_soft_cap_reaches_the_pallas_kernels(tmp_path):
    """Gemma 2's logits through a Pallas kernel (pallas_gpu, interpret mode) match transformers too: the cap is
    applied inside the kernel (without it these logits are ~0.3 off). The model hands `soft_cap` to the one
    dispatch for every backend; the kernels' own capped scores are checked in tests/engine/test_pallas_kernels.py (both
    TPU and GPU kernels: the `softcap` cases). pallas_tpu's interpret mode passed too (72 s here, so not kept)."""
    hf = make_tiny_checkpoint("gemma2", tmp_path, seed=5)
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences(), attention_backend="pallas_gpu")


def test_greedy_matches_transformers_with_prefix_caching_and_under_preemption(checkpoint):
    """32 greedy tokens of prompts of 7, 30 and 1 tokens and of four prompts sharing a 24-token prefix equal
    transformers' with prefix caching on (and hits) and off, both with a KV cache small enough to preempt (the
    same shapes: the second engine loads the first one's programs from the compilation cache)."""
    from vllm_jax import EngineArgs
    from vllm_jax.engine.llm_engine import LLMEngine

    _, path, hf = checkpoint
    rng = np.random.default_rng(2)
    shared = rng.integers(3, VOCAB_SIZE, 24).tolist()
    prompts = [rng.integers(3, VOCAB_SIZE, n).tolist() for n in (7, 30, 1)]
    prompts += [shared + rng.integers(3, VOCAB_SIZE, 4).tolist() for _ in range(4)]
    reference = [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]
    base = dict(model=str(path), max_model_len=64, block_size=8, max_num_seqs=8, max_num_batched_tokens=32,
                num_gpu_blocks_override=10, min_token_bucket=32, min_seq_bucket=8)  # one bucket: one forward

    def engine(**args) -> LLMEngine:
        return LLMEngine(EngineArgs(**base, **args).create_config(), warmup=False)

    cached = engine(enable_prefix_caching=True)
    first, rest = engine_greedy(cached, prompts[:5], MAX_TOKENS), engine_greedy(cached, prompts[5:], MAX_TOKENS)
    assert first + rest == reference
    assert cached.kv_cache_manager.prefix_cache_hits > 0
    uncached = engine(enable_prefix_caching=False)
    assert engine_greedy(uncached, prompts, MAX_TOKENS) == reference
    assert cached.scheduler.num_preemptions_total > 0 and uncached.scheduler.num_preemptions_total > 0


def test_unsupported_gemma_options_are_refused():
    from transformers import Gemma2Config, Gemma3TextConfig

    base = dict(architectures=["Gemma2ForCausalLM"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=VOCAB_SIZE, intermediate_size=128)
    with pytest.raises(ValueError, match="hidden_activation 'gelu'"):
        gemma_spec_from_hf_config(Gemma2Config(**base, hidden_activation="gelu"))
    config = Gemma3TextConfig(**{**base, "architectures": ["Gemma3ForCausalLM"]}, use_bidirectional_attention=True)
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        gemma_spec_from_hf_config(config)


def test_multimodal_gemma_is_refused_with_a_reason():
    from types import SimpleNamespace

    from vllm_jax.model.registry import resolve_architecture

    for arch in ("Gemma4ForConditionalGeneration", "Gemma3ForConditionalGeneration"):
        with pytest.raises(ValueError, match="text-only"):
            resolve_architecture(SimpleNamespace(architectures=[arch]))

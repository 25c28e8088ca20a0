"""Gemma 4 (text) against transformers on tiny random checkpoints (tests/helpers/gemma4_models.py): logits on
ragged chunked batches with attention_k_eq_v both ways, 32-token greedy continuations through an engine with
prefix caching and preemption, the KV cache holding only the producing layers, and the options refused (the MoE
block: tests/engine/test_gemma4_moe.py)."""

from __future__ import annotations

import pytest

from tests.helpers.family_checks import ENGINE, MAX_TOKENS, engine_greedy, engine_prompts
from tests.helpers.gemma4_models import LAYER_TYPES, gemma4_config, make_tiny_gemma4
from tests.helpers.parity import assert_logits_match_over_two_chunked_steps, ragged_sequences
from tests.helpers.tiny_models import hf_greedy
from vllm_jax.model.gemma4_spec import gemma4_spec_from_hf_config
from vllm_jax.worker.kv_cache import spec_bytes_per_block


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """k_eq_v full layers with one global KV head of 32 (repeated to the sliding layers' 2), sliding ones of 16."""
    path = tmp_path_factory.mktemp("gemma4")
    return path, make_tiny_gemma4(path, seed=3)


def test_spec_reads_per_layer_shapes_kv_sharing_and_rope():
    spec = gemma4_spec_from_hf_config(gemma4_config())
    assert spec.layer_head_dims == (16, 16, 32, 16, 32) and spec.layer_kv_heads == (2, 2, 1, 2, 1)
    assert spec.kv_source == (0, 1, 2, 1, 2) and spec.producers == (0, 1, 2)
    assert [spec.cache_layer_of(i) for i in range(5)] == [0, 1, 2, 1, 2]
    assert spec.layer_intermediate == (96, 96, 96, 192, 192)  # double-wide MLP on the KV-shared layers
    assert spec.sliding_windows == (6, 6, 0, 6, 0) and spec.sm_scale == 1.0 and spec.final_soft_cap == 3.0
    # proportional rope on the full layers: 0.25 of global_head_dim 32 rotates (4 angles, base 1e6), the rest 0
    assert spec.global_inv_freq[:4] == pytest.approx([1e6 ** (-2 * i / 32) for i in range(4)])
    assert spec.global_inv_freq[4:] == (0.0,) * 12
    assert spec.inv_freq == pytest.approx([1e4 ** (-2 * i / 16) for i in range(8)])
    # the cache: 3 producing layers, 2 KV heads of 32 per token (the full layers' one head repeated, the sliding
    # layers' 16-wide K/V zero-padded)
    assert (spec.num_cache_layers, spec.kv_cache_heads, spec.kv_cache_width) == (3, 4, 32)
    assert spec_bytes_per_block(spec, 8, "float32") == 3 * 8 * 4 * 32 * 4


def test_logits_match_transformers_on_ragged_chunked_batches(checkpoint):
    path, hf = checkpoint
    assert_logits_match_over_two_chunked_steps(hf, path, ragged_sequences())


def test_logits_match_with_separate_values_and_more_global_kv_heads(tmp_path):
    """attention_k_eq_v off (a v_proj on every layer), full layers with the sliding layers' 2 KV heads (no
    repeats), no KV sharing, 3 layers (sliding, full, sliding: the last
    one forced to full by transformers); per-layer arrays (--no-scan-layers)."""
    hf = make_tiny_gemma4(tmp_path, seed=4, attention_k_eq_v=False, num_global_key_value_heads=None,
                          num_kv_shared_layers=0, num_hidden_layers=3, layer_types=LAYER_TYPES[1:4])
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences(), layers="unrolled")


def test_engine_greedy_matches_transformers_with_prefix_caching_and_preemption(checkpoint):
    """32 greedy tokens of seven prompts equal transformers' through an engine with prefix caching on (the shared
    prefix is hit) and a cache small enough to preempt; the cache holds the 3 producing layers, not 5."""
    from vllm_jax import EngineArgs
    from vllm_jax.engine.llm_engine import LLMEngine

    path, hf = checkpoint
    prompts = engine_prompts()
    engine = LLMEngine(EngineArgs(model=str(path), **ENGINE, enable_prefix_caching=True).create_config(),
                       warmup=False)
    assert engine.runner.kv_cache.shape == (3, ENGINE["num_gpu_blocks_override"], 8, 4, 32)
    assert engine_greedy(engine, prompts) == [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]
    assert engine.scheduler.num_preemptions_total > 0 and engine.kv_cache_manager.prefix_cache_hits > 0


def test_refused_options_name_what_is_wrong():
    with pytest.raises(ValueError, match="hidden_activation"):
        gemma4_spec_from_hf_config(gemma4_config(hidden_activation="silu"))
    with pytest.raises(ValueError, match="do not fit the KV cache"):  # 2 sliding KV heads cannot repeat into 3
        gemma4_spec_from_hf_config(gemma4_config(num_attention_heads=6, num_global_key_value_heads=3))

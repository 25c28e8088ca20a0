"""Gemma 4's MoE block (`enable_moe_block`, model/gemma4_moe.py) against transformers on tiny random checkpoints
(tests/helpers/gemma4_models.py with MOE: 4 experts of 32, top 2, beside every layer's MLP; both layer types, KV
sharing and PLE kept; router scales and the block's norms randomized): logits on ragged chunked batches, 32-token
greedy continuations through an engine with prefix caching and preemption (TP 2 and expert parallelism:
tests/multidevice/test_gemma4_moe_tp.py), and the sizes the spec reads / refuses."""

from __future__ import annotations

import pytest
from jax.sharding import PartitionSpec as P

from tests.helpers.family_checks import ENGINE, MAX_TOKENS, engine_greedy, engine_prompts
from tests.helpers.gemma4_models import LAYER_TYPES, MOE, gemma4_config, make_tiny_gemma4
from tests.helpers.parity import assert_logits_match_over_two_chunked_steps, ragged_sequences
from tests.helpers.tiny_models import hf_greedy
from vllm_jax.model.gemma4_spec import gemma4_spec_from_hf_config
from vllm_jax.sharding.rules import param_partition_spec


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4_moe")
    return path, make_tiny_gemma4(path, seed=5, **MOE)


def test_spec_reads_the_moe_sizes_and_refuses_bad_ones():
    spec = gemma4_spec_from_hf_config(gemma4_config(**MOE))
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size) == (4, 2, 32)
    assert gemma4_spec_from_hf_config(gemma4_config()).num_experts is None  # dense: no experts for the runner
    with pytest.raises(ValueError, match="top_k_experts"):
        gemma4_spec_from_hf_config(gemma4_config(**(MOE | {"top_k_experts": 5})))


def test_partition_rules_split_experts_on_width_or_on_experts():
    """Without EP the experts split on their FFN width like Mixtral's; with EP on the expert axis; the router
    stays replicated either way."""
    spec = gemma4_spec_from_hf_config(gemma4_config(**MOE))
    gate, down, router = (4, 4, 64, 32), (4, 4, 32, 64), (4, 64, 4)
    assert param_partition_spec(("layers", "sliding_experts_gate"), gate, spec, 2) == P(None, None, None, "model")
    assert param_partition_spec(("layers", "full_shared_experts_down"), down, spec, 2) == P(None, None, "model", None)
    assert param_partition_spec(("layers", "sliding_experts_up"), gate, spec, 2, True) == P(None, "model", None, None)
    assert param_partition_spec(("layers", "full_experts_down"), down, spec, 2, True) == P(None, "model", None, None)
    assert param_partition_spec(("layers", "sliding_router"), router, spec, 2, True) == P()


def test_logits_match_transformers_on_ragged_chunked_batches(checkpoint):
    path, hf = checkpoint
    assert_logits_match_over_two_chunked_steps(hf, path, ragged_sequences())


def test_logits_match_without_kv_sharing_on_per_layer_arrays(tmp_path):
    """Values from their own v_proj, no KV sharing, 3 layers (sliding, full, sliding forced to full), top 3 of 4
    experts; per-layer arrays (--no-scan-layers)."""
    hf = make_tiny_gemma4(tmp_path, seed=6, attention_k_eq_v=False, num_kv_shared_layers=0, num_hidden_layers=3,
                          layer_types=LAYER_TYPES[1:4], **(MOE | {"top_k_experts": 3}))
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences(), layers="unrolled")


def test_engine_greedy_matches_transformers_with_prefix_caching_and_preemption(checkpoint):
    """32 greedy tokens of seven prompts equal transformers' through an engine with prefix caching on (the shared
    prefix is hit) and a cache small enough to preempt."""
    from vllm_jax import EngineArgs
    from vllm_jax.engine.llm_engine import LLMEngine

    path, hf = checkpoint
    prompts = engine_prompts()
    engine = LLMEngine(EngineArgs(model=str(path), **ENGINE, enable_prefix_caching=True).create_config(),
                       warmup=False)
    assert engine_greedy(engine, prompts) == [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]
    assert engine.scheduler.num_preemptions_total > 0 and engine.kv_cache_manager.prefix_cache_hits > 0

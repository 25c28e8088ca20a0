"""MoE models (Mixtral, Qwen3-MoE) against transformers, and the grouped expert FFN against a dense reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.helpers.parity import (
    assert_greedy_matches_transformers,
    assert_logits_match_over_two_chunked_steps,
    load_forward,
    ragged_sequences,
)
from tests.helpers.tiny_models import MOE_ARCHS, make_tiny_checkpoint
from vllm_jax.model.moe import grouped_expert_ffn, route


def _hf_routing(hf, seq) -> list[np.ndarray]:
    """transformers' top-k expert ids per MoE layer for one sequence."""
    with torch.no_grad():
        out = hf(torch.tensor([seq]), output_router_logits=True)
    k = hf.config.num_experts_per_tok
    return [torch.topk(logits.float().softmax(-1), k, dim=-1).indices.numpy() for logits in out.router_logits]


@pytest.mark.parametrize("arch", sorted(MOE_ARCHS))
def test_logits_match_transformers_on_ragged_chunked_batches(arch, tmp_path):
    """Four sequences of different lengths, each split into two chunks over two steps, mixed with a
    decode-sized row: every computed position's logits match transformers within 1e-4."""
    hf = make_tiny_checkpoint(arch, tmp_path)
    spec = load_forward(tmp_path)[0]
    assert spec.architecture == hf.config.architectures[0]
    seqs = ragged_sequences()
    # the routing really varies: over these 44 tokens every layer uses every expert, in several pairs
    routing = _hf_routing(hf, sum(seqs, []))
    assert len(routing) == sum(spec.moe_layers)
    for ids in routing:
        assert set(ids.ravel().tolist()) == set(range(spec.num_experts))
        assert len({tuple(sorted(row)) for row in ids.tolist()}) >= 4
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, seqs)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_logits_match_transformers_with_unrolled_layers(arch, tmp_path):
    """The MoE model's Python loop over per-layer arrays (--no-scan-layers, the GPU's default)."""
    hf = make_tiny_checkpoint(arch, tmp_path)
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences(), layers="unrolled")


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_greedy_continuation_of_32_tokens_is_token_identical(arch, tmp_path):
    hf = make_tiny_checkpoint(arch, tmp_path, seed=3)
    assert_greedy_matches_transformers(hf, tmp_path)


def _dense_reference(x, weights, ids, w_gate, w_up, w_down):
    """Per token, per chosen expert, in float64: sum_k w * down(silu(gate(x)) * up(x))."""
    x, w_gate, w_up, w_down = (np.asarray(a, np.float64) for a in (x, w_gate, w_up, w_down))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for weight, e in zip(np.asarray(weights)[t], np.asarray(ids)[t]):
            g, u = x[t] @ w_gate[e], x[t] @ w_up[e]
            out[t] += weight * ((g / (1 + np.exp(-g)) * u) @ w_down[e])
    return out


def _random_moe(seed, t=37, h=16, i=24, e=6, k=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(t, h)).astype(np.float32)
    router = rng.normal(size=(h, e)).astype(np.float32)
    w_gate, w_up = (rng.normal(size=(e, h, i)).astype(np.float32) * 0.3 for _ in range(2))
    w_down = rng.normal(size=(e, i, h)).astype(np.float32) * 0.3
    return x, router, w_gate, w_up, w_down, k


def test_grouped_expert_ffn_equals_dense_per_token_reference():
    x, router, w_gate, w_up, w_down, k = _random_moe(0)
    weights, ids = jax.jit(route, static_argnums=(2, 3, 4))(jnp.asarray(x), jnp.asarray(router), k, True, False)
    assert len(np.unique(np.asarray(ids))) == w_gate.shape[0]  # every expert gets tokens
    np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-6)
    got = jax.jit(grouped_expert_ffn)(x, weights, ids, w_gate, w_up, w_down)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), _dense_reference(x, weights, ids, w_gate, w_up, w_down),
                               atol=2e-5, rtol=1e-5)


def test_grouped_expert_ffn_over_expert_slabs_sums_to_the_whole():
    """What each expert-parallel shard computes: slabs of experts (with their offsets) add up to the full FFN,
    and an empty group (no token routed to an expert) is fine."""
    x, router, w_gate, w_up, w_down, k = _random_moe(1, e=8, k=2)
    weights, ids = route(jnp.asarray(x), jnp.asarray(router), k, False, False)
    ids = jnp.where(ids == 5, 6, ids)  # nobody uses expert 5
    ffn = jax.jit(grouped_expert_ffn)
    whole = np.asarray(ffn(x, weights, ids, w_gate, w_up, w_down))
    parts = sum(np.asarray(ffn(x, weights, ids, w_gate[s:s + 2], w_up[s:s + 2], w_down[s:s + 2], s))
                for s in range(0, 8, 2))
    np.testing.assert_allclose(parts, whole, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(whole, _dense_reference(x, weights, ids, w_gate, w_up, w_down), atol=2e-5,
                               rtol=1e-5)


def test_routing_matches_transformers_routers():
    """route() against transformers' own router modules (Mixtral always renormalizes; Qwen3-MoE only with
    norm_topk_prob) on the same weights."""
    from transformers import MixtralConfig, Qwen3MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    torch.manual_seed(0)
    x = torch.randn(29, 16)
    cases = [(MixtralTopKRouter(MixtralConfig(hidden_size=16, num_local_experts=6, num_experts_per_tok=2)),
              True, False)]
    for norm in (False, True):
        config = Qwen3MoeConfig(hidden_size=16, num_experts=6, num_experts_per_tok=3, norm_topk_prob=norm)
        cases.append((Qwen3MoeTopKRouter(config), norm, True))
    for router, normalize, round_weights in cases:
        torch.nn.init.normal_(router.weight, std=0.5)
        with torch.no_grad():
            _, ref_w, ref_ids = router(x)
        w, ids = route(jnp.asarray(x.numpy()), jnp.asarray(router.weight.detach().numpy().T), router.top_k,
                       normalize, round_weights)
        np.testing.assert_array_equal(np.asarray(ids), ref_ids.numpy())
        np.testing.assert_allclose(np.asarray(w), ref_w.numpy(), rtol=1e-6, atol=1e-7)


def test_spec_reads_sparse_step_and_mlp_only_layers():
    from transformers import Qwen3MoeConfig

    from vllm_jax.model.moe_spec import moe_spec_from_hf_config

    base = dict(architectures=["Qwen3MoeForCausalLM"], hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                intermediate_size=128)
    spec = moe_spec_from_hf_config(Qwen3MoeConfig(**base, decoder_sparse_step=2, mlp_only_layers=[3]))
    assert spec.moe_layers == (False, True, False, False, False, True)
    assert (spec.intermediate_size, spec.dense_intermediate_size) == (48, 128)
    assert moe_spec_from_hf_config(Qwen3MoeConfig(**base)).dense_intermediate_size == 0
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        moe_spec_from_hf_config(Qwen3MoeConfig(**{**base, "num_experts_per_tok": 5}))

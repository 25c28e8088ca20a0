"""The gated DeltaNet mixer (vllm_jax/model/ssm/gated_deltanet.py) against transformers' torch layers: Qwen3.5's
Qwen3_5GatedDeltaNet and Qwen3-Next's Qwen3NextGatedDeltaNet (its fused projections split at load time,
gated_deltanet_weights.py), sequences one by one in torch against one ragged batch here, fresh and continuing
transformers' own cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import DynamicCache, Qwen3_5TextConfig, Qwen3NextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

from vllm_jax.model.ssm.gated_deltanet import GatedDeltaNetSpec, gated_deltanet
from vllm_jax.model.ssm.gated_deltanet_weights import hf_gated_deltanet_weights

HIDDEN = 64
SHAPES = dict(hidden_size=HIDDEN, num_hidden_layers=1, layer_types=["linear_attention"], linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
              num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=64, vocab_size=100)


def tiny_layer(family: str) -> tuple[torch.nn.Module, object]:
    """A random torch layer (its norm and dt_bias randomised too), with its config."""
    torch.manual_seed(0)
    if family == "qwen3_5":
        config = Qwen3_5TextConfig(**SHAPES)
        layer = Qwen3_5GatedDeltaNet(config, 0)
    else:
        config = Qwen3NextConfig(**SHAPES, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32,
                                 shared_expert_intermediate_size=32)
        layer = Qwen3NextGatedDeltaNet(config, 0)
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if name in ("norm.weight", "dt_bias"):
                param.copy_(torch.randn_like(param) * 0.5 + 1.0)
    return layer.eval(), config


def ours(spec, w, x, lens, num_rows, conv_initial=None, rec_initial=None, padding=3):
    """Our mixer over the ragged batch of `lens` (padded to `num_rows` rows and `padding` tokens past the last)."""
    total = sum(lens)
    qsl = np.array([0, *np.cumsum(lens)] + [total] * (num_rows - len(lens)), np.int32)
    x = np.concatenate([x, np.zeros((padding, HIDDEN), np.float32)])
    if conv_initial is None:
        conv_initial = np.zeros((num_rows, spec.conv_kernel - 1, spec.conv_dim), np.float32)
        rec_initial = np.zeros((num_rows, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim), np.float32)
    fn = jax.jit(gated_deltanet, static_argnums=0)
    out, conv, rec = fn(spec, {n: jnp.asarray(t) for n, t in w.items()}, jnp.asarray(x), jnp.asarray(conv_initial),
                        jnp.asarray(rec_initial), jnp.asarray(qsl), jnp.asarray([len(lens)], jnp.int32))
    return np.asarray(out)[:total], np.asarray(conv), np.asarray(rec), qsl


def layer_and_weights(family: str):
    layer, config = tiny_layer(family)
    spec = GatedDeltaNetSpec.from_config(config)
    tensors = {name: t.detach().numpy() for name, t in layer.state_dict().items()}
    return layer, spec, hf_gated_deltanet_weights(spec, tensors)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_fresh_sequences_equal_transformers_one_by_one(family):
    layer, spec, w = layer_and_weights(family)
    assert spec.num_k_heads != spec.num_v_heads
    lens = [5, 1, 0, 70, 17]
    x = np.random.default_rng(0).normal(size=(sum(lens), HIDDEN)).astype(np.float32)
    out, _, rec, qsl = ours(spec, w, x, lens, num_rows=len(lens) + 1)
    for s in range(len(lens)):
        if lens[s]:
            with torch.no_grad():
                ref = layer(torch.tensor(x[qsl[s]:qsl[s + 1]][None]))[0].numpy()
            np.testing.assert_allclose(out[qsl[s]:qsl[s + 1]], ref, rtol=1e-4, atol=1e-4)
    assert np.isfinite(rec).all()


def test_continuation_equals_transformers_cache():
    """Prefixes in one step, their continuations (decodes and prompt chunks) in the next, then a step of decodes
    only (T == S: the recurrent form), each row starting from the states the step before left: equal to
    transformers' layer continuing its DynamicCache, outputs and states."""
    layer, spec, w = layer_and_weights("qwen3_5")
    _, config = tiny_layer("qwen3_5")
    steps = [[9, 3, 40, 2], [1, 12, 1, 30], [1, 1, 1, 1]]
    num_rows = len(steps[0]) + 1
    x = np.random.default_rng(1).normal(size=(sum(map(sum, steps)), HIDDEN)).astype(np.float32)
    caches = [DynamicCache(config=config) for _ in steps[0]]
    conv, rec, start = None, None, 0
    for lens in steps:
        step_x = x[start:start + sum(lens)]
        start += sum(lens)
        padding = num_rows - sum(lens) if sum(lens) < num_rows else 3
        out, conv, rec, qsl = ours(spec, w, step_x, lens, num_rows, conv, rec, padding)
        for s, cache in enumerate(caches):
            with torch.no_grad():
                ref = layer(torch.tensor(step_x[qsl[s]:qsl[s + 1]][None]), cache=cache)[0].numpy()
            np.testing.assert_allclose(out[qsl[s]:qsl[s + 1]], ref, rtol=1e-4, atol=1e-4)
            conv_state = cache.get_conv_state(0)[0].numpy().T  # transformers keeps the last K inputs; we keep K-1
            np.testing.assert_allclose(conv[s], conv_state[1:], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(rec[s], cache.get_recurrent_state(0)[0].numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(rec[-1], 0.0)  # the padding row keeps its (zero) state

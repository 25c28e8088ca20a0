"""Granite 4.0-H's Mamba decoder layer (vllm_jax/model/ssm/granite_hybrid_block.py) against transformers'
GraniteMoeHybridDecoderLayer (a Mamba layer, dense: the shared MLP only), each sequence alone from fresh states."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from transformers import GraniteMoeHybridConfig
from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridDecoderLayer

from vllm_jax.model.ssm.granite_hybrid_block import (
    GraniteMambaBlockSpec,
    granite_mamba_block,
    granite_mamba_block_weights_from_hf,
)


@functools.partial(jax.jit, static_argnums=0)
def _block(spec, w, hidden, conv, ssm, qsl, num_seqs):
    return granite_mamba_block(spec, w, hidden, conv, ssm, qsl, num_seqs)


def test_mamba_layer_equals_transformers_per_sequence():
    config = GraniteMoeHybridConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=32,
                                    num_local_experts=0, shared_intermediate_size=96, residual_multiplier=0.4,
                                    mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4,
                                    mamba_expand=2, mamba_chunk_size=4, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    layer = GraniteMoeHybridDecoderLayer(config, 0).eval()
    assert layer.mamba is not None
    with torch.no_grad():
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight", "mamba.norm.weight", "mamba.D",
                     "mamba.A_log", "mamba.dt_bias"):
            layer.get_parameter(name).add_(0.5 * torch.randn_like(layer.get_parameter(name)))
    spec = GraniteMambaBlockSpec.from_config(config)
    tensors = {name: p.detach().numpy() for name, p in layer.state_dict().items()}
    w = jax.tree.map(jnp.asarray, granite_mamba_block_weights_from_hf(spec, tensors, ""))

    lens = [7, 1, 10, 0]
    num_seqs = 3
    starts = np.concatenate([[0], np.cumsum(lens[:num_seqs])]).astype(int).tolist()
    qsl = np.array(starts + [starts[-1]], np.int32)
    x = np.random.default_rng(0).normal(size=(sum(lens) + 2, config.hidden_size)).astype(np.float32)
    rows = len(lens)
    out, _, ssm_final = _block(spec, w, jnp.asarray(x),
                               jnp.zeros((rows, *spec.mamba.conv_state_shape), jnp.float32),
                               jnp.zeros((rows, *spec.mamba.ssm_state_shape), jnp.float32),
                               jnp.asarray(qsl), jnp.asarray([num_seqs], jnp.int32))
    out = np.asarray(out)
    for s in range(num_seqs):
        with torch.no_grad():
            ref = layer(torch.tensor(x[starts[s]:starts[s + 1]][None]))[0].numpy()
        np.testing.assert_allclose(out[starts[s]:starts[s + 1]], ref, rtol=1e-4, atol=1e-4)
    assert np.isfinite(np.asarray(ssm_final)).all()

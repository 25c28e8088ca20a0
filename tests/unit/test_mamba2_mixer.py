"""The Mamba2 mixer (vllm_jax/model/ssm/mamba2.py) against a tiny random transformers GraniteMoeHybridMambaLayer,
its torch forward run on each sequence alone from a fresh state; and a sequence continued over several calls
(a chunked prefill, then decodes) equal to one call."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import GraniteMoeHybridConfig
from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridMambaLayer

from vllm_jax.model.ssm.mamba2 import Mamba2Spec, mamba2_mixer
from vllm_jax.model.ssm.mamba2_weights import mamba2_weights_from_hf


def _tiny_layer(n_groups: int, proj_bias: bool) -> tuple[Mamba2Spec, GraniteMoeHybridMambaLayer, dict]:
    config = GraniteMoeHybridConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=32,
                                    num_local_experts=0, mamba_n_heads=8, mamba_n_groups=n_groups, mamba_d_state=8,
                                    mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=4, mamba_proj_bias=proj_bias,
                                    time_step_limit=(0.6, 1.4), rms_norm_eps=1e-6)
    torch.manual_seed(n_groups)
    layer = GraniteMoeHybridMambaLayer(config, 0).eval()
    with torch.no_grad():  # move the parameters off their special initial values
        for name in ("A_log", "D", "dt_bias", "norm.weight", "conv1d.bias", "in_proj.bias", "out_proj.bias"):
            param = layer.get_parameter(name) if name in dict(layer.named_parameters()) else None
            if param is not None:
                param.add_(0.5 * torch.randn_like(param))
    tensors = {name: p.detach().numpy() for name, p in layer.state_dict().items()}
    w = {key: jnp.asarray(v) for key, v in mamba2_weights_from_hf(Mamba2Spec.from_config(config), tensors,
                                                                  "").items()}
    return Mamba2Spec.from_config(config), layer, w


@functools.partial(jax.jit, static_argnums=0)
def _mixer(spec, w, x, conv, ssm, qsl, num_seqs):
    return mamba2_mixer(spec, w, x, conv, ssm, qsl, num_seqs)


def _step(spec: Mamba2Spec, w: dict, x: np.ndarray, lens: list[int], num_seqs: int, conv=None, ssm=None):
    rows = len(lens)
    starts = np.concatenate([[0], np.cumsum(lens[:num_seqs])]).astype(int).tolist()
    qsl = np.array(starts + [starts[-1]] * (rows - num_seqs), np.int32)
    conv = np.zeros((rows, *spec.conv_state_shape), np.float32) if conv is None else conv
    ssm = np.zeros((rows, *spec.ssm_state_shape), np.float32) if ssm is None else ssm
    out, conv_final, ssm_final = _mixer(spec, w, jnp.asarray(x), jnp.asarray(conv), jnp.asarray(ssm),
                                        jnp.asarray(qsl), jnp.asarray([num_seqs], jnp.int32))
    return np.asarray(out), np.asarray(conv_final), np.asarray(ssm_final), starts


@pytest.mark.parametrize("n_groups,proj_bias", [(1, False), (2, True)])
def test_ragged_mixer_equals_transformers_per_sequence(n_groups, proj_bias):
    spec, layer, w = _tiny_layer(n_groups, proj_bias)
    lens = [9, 1, 0, 4, 13, 0]  # the last row is padding
    num_seqs = 5
    x = np.random.default_rng(n_groups).normal(size=(sum(lens) + 3, spec.hidden_size)).astype(np.float32)
    out, conv_final, ssm_final, starts = _step(spec, w, x, lens, num_seqs)
    assert np.isfinite(out).all() and np.isfinite(ssm_final).all()
    for s in range(num_seqs):
        if lens[s] == 0:
            continue
        with torch.no_grad():
            ref = layer(torch.tensor(x[starts[s]:starts[s + 1]][None]))[0].numpy()
        np.testing.assert_allclose(out[starts[s]:starts[s + 1]], ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(ssm_final[[2, 5]], 0.0)  # rows with no tokens keep their (zero) states
    np.testing.assert_array_equal(conv_final[[2, 5]], 0.0)


def test_a_continued_sequence_equals_one_call_and_transformers():
    spec, layer, w = _tiny_layer(2, False)
    x = np.random.default_rng(5).normal(size=(16, spec.hidden_size)).astype(np.float32)
    whole, conv_whole, ssm_whole, _ = _step(spec, w, x, [16], 1)
    # 10 tokens of prefill beside another row, then the rest one token a step (the recurrent form), the states
    # handed from one call to the next
    other = np.random.default_rng(6).normal(size=(3, spec.hidden_size)).astype(np.float32)
    out, conv, ssm, _ = _step(spec, w, np.concatenate([x[:10], other]), [10, 3], 2)
    pieces = [out[:10]]
    conv, ssm = conv[:1], ssm[:1]
    for t in range(10, 16):
        out, conv, ssm, _ = _step(spec, w, x[t:t + 1], [1], 1, conv, ssm)
        pieces.append(out)
    np.testing.assert_allclose(np.concatenate(pieces), whole, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(conv[0], conv_whole[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ssm[0], ssm_whole[0], rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        ref = layer(torch.tensor(x[None]))[0].numpy()
    np.testing.assert_allclose(whole, ref, rtol=1e-4, atol=1e-4)


def test_spec_of_a_real_size_config_matches_the_transformers_layer_shapes():
    """Granite 4.0-H Small's mixer fields (mamba_d_head left "auto"): our sizes equal the torch layer's tensors
    (built on the meta device, no memory)."""
    config = GraniteMoeHybridConfig(hidden_size=4096, num_hidden_layers=1, num_attention_heads=32, vocab_size=32,
                                    num_local_experts=0, mamba_n_heads=128, mamba_n_groups=1, mamba_d_state=128,
                                    mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256)
    spec = Mamba2Spec.from_config(config)
    with torch.device("meta"):
        layer = GraniteMoeHybridMambaLayer(config, 0)
    assert spec.head_dim == layer.head_dim == 64
    assert (spec.in_proj_size, spec.hidden_size) == tuple(layer.in_proj.weight.shape)
    assert (spec.conv_dim, 1, spec.conv_kernel) == tuple(layer.conv1d.weight.shape)
    assert spec.norm_group_size == layer.norm.group_size
    assert spec.chunk_size == 64  # capped

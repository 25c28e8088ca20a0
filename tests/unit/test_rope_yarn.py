"""YaRN rope scaling (model/rope_yarn.py) against transformers' own `_compute_yarn_parameters` (float32), for the
configs that use it: gpt-oss (truncate false), DeepSeek-V3 (mscale / mscale_all_dim), a default-ramp one, and a
factor derived from max_position_embeddings with an explicit attention factor."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import GptOssConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from vllm_jax.model.rope import rope_inv_freq
from vllm_jax.model.spec import rope_parameters_of

YARN = [
    dict(factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False, original_max_position_embeddings=4096,
         rope_theta=150000.0),  # gpt-oss
    dict(factor=40.0, mscale=1.0, mscale_all_dim=0.707, beta_fast=32, beta_slow=1,
         original_max_position_embeddings=4096, rope_theta=10000.0),  # DeepSeek-V3
    dict(factor=4.0, original_max_position_embeddings=64, rope_theta=10000.0),  # defaults: truncate, betas
    dict(factor=None, attention_factor=1.3, original_max_position_embeddings=1024, rope_theta=10000.0),
]


@pytest.mark.parametrize("rope", YARN, ids=["gpt_oss", "deepseek_mscale", "defaults", "implicit_factor"])
def test_yarn_matches_transformers(rope):
    config = GptOssConfig(head_dim=64, hidden_size=256, num_attention_heads=4, max_position_embeddings=8192,
                          rope_parameters={"rope_type": "yarn", **rope})
    want, want_scale = ROPE_INIT_FUNCTIONS["yarn"](config)
    got, scale = rope_inv_freq(rope_parameters_of(config), 64)
    assert got.dtype == np.float32 and got.shape == (32,)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=0)  # pow's last bit may differ
    assert scale == pytest.approx(want_scale, rel=1e-12) and scale > 1.0


def test_yarn_without_original_context_is_a_clear_error():
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        rope_inv_freq({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}, 64)

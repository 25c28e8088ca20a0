"""model/layers.py on its own: rotary frequencies against transformers' rope init, the unsupported-type error."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from vllm_jax.model.rope import rope_inv_freq
from vllm_jax.models.llama.spec import spec_from_hf_config

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _config(rope_scaling: dict) -> LlamaConfig:
    return LlamaConfig(architectures=["LlamaForCausalLM"], hidden_size=256, num_attention_heads=4,
                       rope_theta=500000.0, rope_scaling=rope_scaling)


@pytest.mark.parametrize("rope_scaling", [{"rope_type": "linear", "factor": 4.0}, LLAMA3],
                         ids=["linear", "llama3"])
def test_scaled_inverse_frequencies_equal_transformers(rope_scaling):
    config = _config(rope_scaling)
    want, want_scaling = ROPE_INIT_FUNCTIONS[rope_scaling["rope_type"]](config, "cpu")
    got, scaling = rope_inv_freq(config.rope_parameters, 64)
    unscaled, _ = rope_inv_freq({"rope_type": "default", "rope_theta": 500000.0}, 64)
    assert not np.allclose(got, unscaled), "the scaling changed nothing: the test would prove nothing"
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=0)
    assert scaling == want_scaling
    # the spec carries the same frequencies into the model
    np.testing.assert_allclose(spec_from_hf_config(config).inv_freq, want.numpy(), rtol=1e-6, atol=0)


def test_unsupported_rope_type_names_the_supported_ones():
    with pytest.raises(ValueError, match="'dynamic'.*default, linear, llama3"):
        rope_inv_freq({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, 64)

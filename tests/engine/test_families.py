"""Granite, OLMo 2 and Phi-3 against transformers (PyTorch CPU, float32) on tiny random checkpoints: ragged
chunked logits within 1e-4, 32-token greedy continuations through the engine (prefix caching on / off,
preemption); TP 2 = TP 1: tests/multidevice/test_families_tp.py. Phi-3 past its original context:
tests/engine/test_phi3.py."""

from __future__ import annotations

import pytest

from tests.helpers.family_checks import assert_engine_greedy_matches
from tests.helpers.family_models import FAMILIES as FAMILY_CONFIGS
from tests.helpers.family_models import make_family_checkpoint
from tests.helpers.parity import assert_logits_match_over_two_chunked_steps, ragged_sequences
from vllm_jax.model.registry import resolve_architecture

FAMILIES = ["granite", "olmo2", "phi3"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, make_family_checkpoint(request.param, path, seed=3)


def test_logits_match_transformers_on_ragged_chunked_batches(family):
    _, path, hf = family
    assert_logits_match_over_two_chunked_steps(hf, path, ragged_sequences())


def test_greedy_tokens_equal_transformers_with_prefix_caching_and_preemption(family):
    _, path, hf = family
    assert_engine_greedy_matches(hf, path)


@pytest.mark.parametrize("name, change, message", [
    ("granite", dict(logits_scaling=0.0), "logits_scaling must not be 0"),
    ("olmo2", dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    ("phi3", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
     "rope_type 'linear' is not supported"),
])
def test_unsupported_config_options_are_named(name, change, message):
    config_cls, _, extra = FAMILY_CONFIGS[name]
    config = config_cls(**{**extra, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "architectures": [config_cls.__name__.replace("Config", "ForCausalLM")]})
    for key, value in change.items():
        setattr(config, key, value)
    with pytest.raises(ValueError, match=message):
        resolve_architecture(config)

"""Granite, OLMo 2 and Phi-3 against transformers (PyTorch CPU, float32) on tiny random checkpoints (their ragged
chunked logits: tests/engine/test_family_units.py): 32-token greedy continuations through the engine (prefix
caching on / off, preemption); TP 2 = TP 1: tests/multidevice/test_families_tp.py. Phi-3 past its original
context: tests/engine/test_phi3.py."""

from __future__ import annotations

import pytest

from tests.helpers.family_checks import assert_engine_greedy_matches
from tests.helpers.family_models import make_family_checkpoint
from tests.helpers.tiny_models import tiny_config
from vllm_jax.models.registry import resolve_architecture

FAMILIES = ["granite", "olmo2", "phi3"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, make_family_checkpoint(request.param, path, seed=3)


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
    config = tiny_config(name)
    for key, value in change.items():
        setattr(config, key, value)
    with pytest.raises(ValueError, match=message):
        resolve_architecture(config)

"""The multi-device tests of tests/engine/test_spec_decode_eagle3.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

from tests.engine.test_spec_decode_eagle3 import (
    _greedy_with_proposals,
    setup,  # noqa: F401  (a fixture)
)


def test_tp2_proposes_and_generates_as_tp1(setup):  # noqa: F811
    """EAGLE-3 at TP 2 on the session's fake CPU devices: the head split like the target's layers (fc on its
    input, lm_head on the draft vocabulary) and its cache on its KV heads; every step's proposals and the greedy
    tokens are TP 1's, and the tokens no speculation's."""
    from flax import nnx

    one, one_proposals, _ = _greedy_with_proposals(setup, 1)
    two, two_proposals, engine = _greedy_with_proposals(setup, 2)
    assert one == two == setup["expected"][:4]
    assert two_proposals == one_proposals and sum(len(p) for p in one_proposals) >= 20
    eagle = engine.runner.eagle
    specs = {name: list(value.sharding.spec) for name, value in nnx.to_pure_dict(eagle.params)["midlayer"].items()}
    assert specs["q_proj"] == specs["k_proj"] == specs["gate_proj"] == [None, "model"]
    assert specs["o_proj"] == specs["down_proj"] == ["model", None]
    assert specs["input_norm"] == []
    state = nnx.to_pure_dict(eagle.params)
    assert list(state["fc"].sharding.spec) == ["model", None]
    assert list(state["lm_head"].sharding.spec) == [None, "model"]
    assert list(state["d2t"].sharding.spec) == []
    assert tuple(eagle.kv_cache.sharding.spec)[:4] == (None, None, None, "model")  # [1, blocks, size, 2 * kv, dim]
    assert engine.kv_cache_manager.num_free_blocks == engine.kv_cache_manager.num_usable_blocks

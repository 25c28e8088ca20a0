"""The multi-device tests of tests/engine/test_gemma4_moe.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

import shutil

import pytest

from tests.engine.test_gemma4_moe import (
    checkpoint,  # noqa: F401  (a fixture)
)
from tests.helpers.multidevice_checks import run_check
from tests.helpers.tiny_models import hf_greedy


@pytest.mark.slow
def test_tp2_and_expert_parallel_greedy_tokens_equal_transformers_on_fake_devices(checkpoint, tmp_path):  # noqa: F811
    """TP 2 (experts split on their width) and TP 2 with expert parallelism (two experts per device, a psum) on
    fake CPU devices: 10 greedy tokens of three prompts equal transformers' (= TP 1's)."""
    from tests.helpers.parallel_workload import prompts

    path, hf = checkpoint
    shutil.copytree(path, tmp_path / "gemma4_moe")
    result = run_check("gemma4_moe_parallel", tmp_path)
    expected = [hf_greedy(hf, p, 10) for p in prompts()]
    assert result["tp2"] == expected and result["tp2_ep"] == expected
    assert result["tp2_specs"] == {"sliding_experts_gate": [None, None, None, "model"],
                                   "full_shared_experts_down": [None, None, "model"], "sliding_router": []}
    assert result["ep_specs"] == {"sliding_experts_gate": [None, "model"], "full_shared_experts_down": [None, "model"],
                                  "sliding_router": []}

"""The multi-device tests of tests/engine/test_gemma4.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

import pytest

from tests.engine.test_gemma4 import (
    checkpoint,  # noqa: F401  (a fixture)
)
from tests.helpers.multidevice_checks import run_check
from tests.helpers.tiny_models import hf_greedy


@pytest.mark.slow
def test_tp2_greedy_tokens_equal_transformers_on_fake_devices(checkpoint, tmp_path):  # noqa: F811
    """TP 2 on fake CPU devices (xla backend, GSPMD): 10 greedy tokens of three prompts equal transformers'."""
    import shutil

    from tests.helpers.parallel_workload import prompts

    path, hf = checkpoint
    shutil.copytree(path, tmp_path / "gemma4")
    result = run_check("gemma4_tensor_parallel", tmp_path)
    assert result["tp2"] == [hf_greedy(hf, p, 10) for p in prompts()]
    assert result["cache_spec"] == [None, None, None, "model"]
    assert result["specs"] == {"sliding_q_proj": [None, None, "model"], "full_down_proj": [None, "model"],
                               "sliding_per_layer_input_gate": [None, None, "model"], "full_k_proj": [],
                               "embed_tokens_per_layer": ["model"]}

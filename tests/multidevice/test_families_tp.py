"""The multi-device tests of tests/engine/test_families.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.test_families import (
    FAMILIES,
)
from tests.helpers.multidevice_checks import run_check


@pytest.mark.parametrize("name", FAMILIES)
def test_tp2_logits_equal_tp1(name, tmp_path):
    result = run_check(f"{name}_tensor_parallel", tmp_path)
    np.testing.assert_allclose(np.array(result["tp2"]), np.array(result["tp1"]), atol=1e-4, rtol=0)
    column, row = [None, None, "model"], [None, "model"]
    assert result["specs"] == {"q_proj": column, "k_proj": column, "v_proj": column, "gate_proj": column,
                               "up_proj": column, "o_proj": row, "down_proj": row}
    if name == "phi3":  # each device read only its half of q, k and v out of the fused [q 64 | k 32 | v 32] rows
        assert [tuple(r) for r in result["tp2_qkv_rows"]] == [(0, 32), (32, 64), (64, 80), (80, 96), (96, 112),
                                                             (112, 128)]

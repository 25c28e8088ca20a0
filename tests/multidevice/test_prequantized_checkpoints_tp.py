"""The multi-device tests of tests/engine/test_prequantized_checkpoints.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

import numpy as np

from tests.engine.test_prequantized_checkpoints import (
    runners,  # noqa: F401  (a fixture)
    workdir,  # noqa: F401  (a fixture)
)
from tests.helpers.multidevice_checks import run_check
from tests.helpers.quantized_models import prompt_logits


def test_tp2_equals_tp1_for_block_fp8(workdir, runners):  # noqa: F811
    tp1 = prompt_logits(runners("fp8_block"))
    result = run_check("prequantized_tensor_parallel", workdir)
    np.testing.assert_allclose(np.array(result["tp2"]), tp1, rtol=1e-4, atol=1e-4)
    assert result["dtypes"] == {"q_proj": "float8_e4m3fn", "down_proj_scale": "float32"}
    specs = result["specs"]
    # column-parallel: values and grouped scales split on out; row-parallel: on the input dim and its groups
    assert specs["q_proj"] == [None, None, "model"] and specs["q_proj_scale"] == [None, None, "model"]
    assert specs["k_proj_scale"] == [None, None, "model"]
    assert specs["down_proj"] == [None, "model"] and specs["down_proj_scale"] == [None, "model"]
    assert specs["o_proj"] == [None, "model"] and specs["o_proj_scale"] == []  # one group: tp 2 cannot split it

"""The multi-device tests of tests/engine/test_quantization.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

import numpy as np

from tests.engine.test_quantization import model_dir  # noqa: F401  (a fixture)
from tests.helpers.multidevice_checks import run_check
from tests.helpers.quantized_models import prompt_logits, quant_runner


def test_tp2_equals_tp1_for_int8(model_dir):  # noqa: F811
    tp1 = prompt_logits(quant_runner(model_dir, "int8"))
    result = run_check("quantized_tensor_parallel", model_dir.parent)
    np.testing.assert_allclose(np.array(result["tp2"]), tp1, rtol=1e-4, atol=1e-4)
    assert result["dtypes"] == {"q_proj": "int8", "q_proj_scale": "float32"}
    specs = result["specs"]
    # column-parallel weights and their scales split on the output dim; row-parallel scales replicated
    assert specs["q_proj"] == [None, None, "model"] and specs["q_proj_scale"] == [None, "model"]
    assert specs["k_proj_scale"] == [None, "model"] and specs["gate_proj_scale"] == [None, "model"]
    assert specs["o_proj"] == [None, "model"] and specs["o_proj_scale"] == [] and specs["down_proj_scale"] == []
    # the quantized embedding and its row scales split on vocab alike
    assert specs["embed_tokens"] == ["model"] and specs["embed_tokens_scale"] == ["model"]

"""The multi-device tests of tests/engine/test_gguf_quantized.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

import numpy as np

from tests.engine.test_gguf_quantized import files  # noqa: F401  (a fixture)
from tests.helpers.multidevice_checks import run_check
from tests.helpers.quantized_models import prompt_logits, quant_runner


def test_tp2_equals_tp1_kept_q4_1(files):  # noqa: F811
    tp1 = prompt_logits(quant_runner(files["Q4_1"], "gguf"))
    result = run_check("gguf_kept_tensor_parallel", files["Q4_1"].parent)
    np.testing.assert_allclose(np.array(result["tp2"]), tp1, rtol=1e-4, atol=1e-4)
    specs = result["specs"]
    # column-parallel: values, scales and mins split on out; row-parallel: values on their packed input rows,
    # scales and mins on the group axis; the embedding and its scales on vocab
    assert specs["q_proj"] == specs["q_proj_scale"] == specs["q_proj_min"] == [None, None, "model"]
    assert specs["o_proj"] == specs["o_proj_scale"] == specs["down_proj_min"] == [None, "model"]
    assert specs["embed_tokens"] == specs["embed_tokens_scale"] == ["model"]

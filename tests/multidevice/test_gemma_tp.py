"""The multi-device tests of tests/engine/test_gemma.py, on the session's fake CPU devices (tests/conftest.py)."""

from __future__ import annotations

from tests.helpers.multidevice_checks import run_check
from tests.helpers.tiny_models import hf_greedy, make_tiny_checkpoint


def test_tp2_greedy_tokens_equal_transformers_on_fake_devices(tmp_path):
    """TP 2 on fake CPU devices: 10 greedy tokens of three prompts equal transformers' (which TP 1 equals, above);
    q_proj split on its output dim, the feed-forward norms replicated."""
    from tests.helpers.parallel_workload import prompts

    hf = {arch: make_tiny_checkpoint(arch, tmp_path / arch, seed=4) for arch in ("gemma2", "gemma3")}
    result = run_check("gemma_tensor_parallel", tmp_path)
    for arch, model in hf.items():
        assert result[f"{arch}_tp2"] == [hf_greedy(model, p, 10) for p in prompts()]
        assert result[f"{arch}_specs"]["q_proj"] == [None, None, "model"]
        assert result[f"{arch}_specs"]["pre_feedforward_norm"] == []

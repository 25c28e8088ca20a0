"""The multi-device tests of tests/engine/test_deepseek.py, on the session's fake CPU devices (tests/conftest.py)."""

from __future__ import annotations


def test_tp2_with_expert_parallel_equals_tp1_with_replicated_latent_cache(tmp_path):
    """On fake CPU devices: MLA's heads split over TP 2 (q_b / kv_b by heads, o_proj by rows), the one latent
    KV row per token replicated on every device, the experts split (EP); greedy tokens equal TP 1's."""
    from tests.helpers.multidevice_checks import run_check

    result = run_check("mla_tensor_parallel", tmp_path)
    assert result["tp1"] == result["tp2_ep"]
    assert result["specs"] == {"q_b_proj": [None, None, "model"], "kv_b_proj": [None, None, "model"],
                               "o_proj": [None, "model"], "kv_a_proj": [], "shared_gate": [None, None, "model"],
                               "shared_down": [None, "model"], "experts_gate": [None, "model"], "kv_cache": []}

"""LoRA slots under tensor parallelism (docs/architecture/11-lora.md, "LoRA adapters"): TP 2 gives TP 1's greedy tokens
(and peft's) for a batch mixing the base model and two adapters, with the slots split like their base layers."""

from __future__ import annotations

from tests.helpers.lora_tp_check import lora_tp_check


def test_tp2_equals_tp1_and_slots_split_like_their_base_layers(tmp_path):
    result = lora_tp_check(tmp_path)
    assert result["tp1"] == result["tp2"] == result["peft"]
    specs = result["specs"]
    for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):  # column-parallel: b split on out
        assert specs[name] == [[], [None, None, None, "model"]], name
    for name in ("o_proj", "down_proj"):  # row-parallel: a split on in
        assert specs[name] == [[None, None, "model"], []], name

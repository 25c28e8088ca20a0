"""LoRA slots under tensor parallelism (docs/architecture/11-lora.md, "LoRA adapters"): TP 2 gives TP 1's greedy tokens
(and peft's) for a batch mixing the base model and two adapters, with the slots split like their base layers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_tp2_equals_tp1_and_slots_split_like_their_base_layers(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tests.helpers.lora_tp_check", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tp1"] == result["tp2"] == result["peft"]
    specs = result["specs"]
    for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):  # column-parallel: b split on out
        assert specs[name] == [[], [None, None, None, "model"]], name
    for name in ("o_proj", "down_proj"):  # row-parallel: a split on in
        assert specs[name] == [[None, None, "model"], []], name

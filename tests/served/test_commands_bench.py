"""`vllm-jax bench serve` against a live server: every request completes, exactly the asked tokens come back,
and the printed table and the saved JSON carry vLLM's result keys."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.live_server import Served, start_server, tiny_checkpoint
from tests.helpers.router import vllm_router
from vllm_jax.cli import main

VLLM_KEYS = {"date", "backend", "model_id", "num_prompts", "request_rate", "max_concurrency", "duration", "completed",
             "failed", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
             "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests", "input_lens",
             "output_lens", "ttfts", "itls", "generated_texts", "errors",
             *(f"{stat}_{m}_ms" for stat in ("mean", "median", "std", "p99") for m in ("ttft", "tpot", "itl", "e2el"))}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("bench"))


@pytest.fixture(scope="module")
def served(checkpoint: Path) -> Iterator[Served]:
    s = start_server(checkpoint)
    yield s
    s.stop()


def test_bench_serve_random_completes_every_request_and_saves_vllms_keys(served, tmp_path, capsys):
    assert main(["bench", "serve", "--base-url", served.url, "--num-prompts", "6", "--random-input-len", "8",
                 "--random-output-len", "4", "--max-concurrency", "2", "--ignore-eos", "--save-result",
                 "--result-dir", str(tmp_path), "--result-filename", "r.json", "--disable-tqdm"]) == 0
    table = capsys.readouterr().out
    assert "Serving Benchmark Result" in table and "Mean TTFT (ms):" in table and "P99 ITL (ms):" in table
    result = json.loads((tmp_path / "r.json").read_text())
    assert VLLM_KEYS <= set(result)
    assert (result["completed"], result["failed"], result["max_concurrency"]) == (6, 0, 2)
    assert 1 <= result["max_concurrent_requests"] <= 2
    assert result["input_lens"] == [8] * 6 and result["output_lens"] == [4] * 6
    assert result["total_output_tokens"] == 24 and result["request_rate"] == "inf"


def test_bench_serve_chat_backend_reads_a_local_sharegpt_file_with_a_local_tokenizer(served, checkpoint, tmp_path,
                                                                                   capsys):
    turns = [[{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": f"answer {i}"}] for i in range(5)]
    (tmp_path / "sg.json").write_text(json.dumps([{"conversations": c} for c in turns]))
    assert main(["bench", "serve", "--base-url", served.url, "--backend", "openai-chat", "--dataset-name",
                 "sharegpt", "--dataset-path", str(tmp_path / "sg.json"), "--num-prompts", "3",
                 "--sharegpt-output-len", "4", "--tokenizer", str(checkpoint), "--request-rate", "50",
                 "--percentile-metrics", "e2el", "--metric-percentiles", "50,90", "--disable-tqdm"]) == 0
    table = capsys.readouterr().out
    assert "Successful requests:                    3" in table and "P90 E2EL (ms):" in table
    assert "TTFT" not in table


def test_bench_sweep_runs_each_concurrency_and_plots_them(served, tmp_path, capsys):
    assert main(["bench", "sweep", "--base-url", served.url, "--num-prompts", "4", "--random-input-len", "8",
                 "--random-output-len", "3", "--ignore-eos", "--max-concurrencies", "1", "4", "--output-dir",
                 str(tmp_path), "--disable-tqdm"]) == 0
    runs = json.loads((tmp_path / "sweep.json").read_text())
    assert [(r["load"], r["max_concurrency"], r["completed"]) for r in runs] == [("1", 1, 4), ("4", 4, 4)]
    assert "p99_tpot_ms" in runs[0] and "ttfts" not in runs[0]
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.count("Serving Benchmark Result") == 2


def test_bench_serve_through_vllm_router_completes_every_request(served, tmp_path):
    """The same command against the real router in front of the server (vLLM users compare engines behind it); the
    model and the prompts' tokens come through the router too (/v1/models, /tokenize)."""
    with vllm_router(served.url) as router_url:
        assert main(["bench", "serve", "--base-url", router_url, "--num-prompts", "4", "--random-input-len", "8",
                     "--random-output-len", "3", "--ignore-eos", "--save-result", "--result-dir", str(tmp_path),
                     "--result-filename", "r.json", "--disable-tqdm"]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert (result["completed"], result["failed"], result["total_output_tokens"]) == (4, 0, 12)

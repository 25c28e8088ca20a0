"""The benchmark datasets and metrics without a server: exact random lengths within the range ratio, shared
prefixes, ShareGPT's filters, and vLLM's percentile, goodput and peak numbers."""

from __future__ import annotations

import json

import pytest

from vllm_jax.commands.bench.datasets import prefix_repetition_requests, random_requests, sharegpt_requests
from vllm_jax.commands.bench.metrics import RequestResult, parse_goodput, summarize


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_random_prompts_have_exact_lengths_within_the_range_ratio():
    fixed = random_requests(chars, num=5, input_len=20, output_len=7, range_ratio=0.0, seed=0)
    assert [(len(r.prompt), r.prompt_len, r.expected_output_len) for r in fixed] == [(20, 20, 7)] * 5
    ranged = random_requests(chars, num=50, input_len=20, output_len=10, range_ratio=0.5, seed=1)
    assert all(10 <= len(r.prompt) == r.prompt_len <= 30 and 5 <= r.expected_output_len <= 15 for r in ranged)
    assert len({r.prompt_len for r in ranged}) > 1
    with pytest.raises(ValueError, match="range-ratio"):
        random_requests(chars, num=1, input_len=8, output_len=8, range_ratio=1.0, seed=0)


def test_prefix_repetition_prompts_share_their_prefixes():
    requests = prefix_repetition_requests(chars, num=12, prefix_len=6, suffix_len=4, num_prefixes=3, output_len=5,
                                          seed=0)
    assert {len(r.prompt) for r in requests} == {10} and {r.expected_output_len for r in requests} == {5}
    assert len({tuple(r.prompt[:6]) for r in requests}) == 3


def test_sharegpt_takes_first_turns_and_skips_short_ones(tmp_path):
    convs = [[{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"}],  # prompt < 4 tokens
             [{"from": "human", "value": "what is two plus two"}, {"from": "gpt", "value": "four, surely"}],
             [{"from": "human", "value": "name a color"}, {"from": "gpt", "value": "blue is one"}]]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([{"conversations": c} for c in convs]))
    requests = sharegpt_requests(chars, path=str(path), num=2, output_len=None, seed=0)
    assert sorted(r.prompt for r in requests) == ["name a color", "what is two plus two"]
    assert {r.expected_output_len for r in requests} == {11, 12}
    with pytest.raises(ValueError, match="only 2 usable"):
        sharegpt_requests(chars, path=str(path), num=3, output_len=None, seed=0)


def test_summary_percentiles_goodput_and_peaks():
    fast = RequestResult(success=True, prompt_len=4, output_tokens=3, start=0.0, ttft=0.1, latency=0.3,
                         itl=[0.1, 0.1])
    slow = RequestResult(success=True, prompt_len=4, output_tokens=3, start=0.1, ttft=0.5, latency=0.9,
                         itl=[0.2, 0.2])
    failed = RequestResult(error="HTTP 500")
    # tokens at 0.1, 0.2, 0.3 (fast) and 0.6, 0.8, 1.0 (slow): five in the run's first second
    s = summarize([fast, slow, failed], 2.0, percentiles=[50, 99], goodput=parse_goodput(["ttft:200"]))
    assert (s["completed"], s["failed"], s["total_output_tokens"]) == (2, 1, 6)
    assert s["request_throughput"] == 1.0 and s["request_goodput"] == 0.5  # only the fast one meets 200 ms
    assert s["p50_ttft_ms"] == pytest.approx(100) and s["p99_ttft_ms"] == pytest.approx(500)
    assert s["mean_tpot_ms"] == pytest.approx(150) and s["max_concurrent_requests"] == 2
    assert s["max_output_tokens_per_s"] == 5.0 and s["errors"] == ["", "", "HTTP 500"]
    with pytest.raises(ValueError, match="goodput"):
        parse_goodput(["latency:5"])

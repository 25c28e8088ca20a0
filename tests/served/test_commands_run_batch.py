"""`vllm-jax run-batch`: one output line per input line, a good line's body as the server answers the same body,
a bad line (not JSON, an unknown url, a bad body) an error line while the rest of the file still runs; the input
and output as http(s) URLs, with the engine's metrics served until the output is uploaded."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.engine_flags import tiny_engine_flags
from tests.helpers.file_server import file_server
from tests.helpers.live_server import MODEL, TEMPLATE, Served, start_server, tiny_checkpoint
from vllm_jax.cli import main

GREEDY = {"model": MODEL, "max_tokens": 6, "temperature": 0}
GOOD = {
    "cmpl": ("/v1/completions", {**GREEDY, "prompt": "hello"}),
    "chat": ("/v1/chat/completions", {**GREEDY, "messages": [{"role": "user", "content": "hi"}]}),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("batch"))


@pytest.fixture(scope="module")
def served(checkpoint: Path) -> Iterator[Served]:
    s = start_server(checkpoint)
    yield s
    s.stop()


def _without_ids(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


def test_run_batch_answers_good_lines_as_the_server_does_and_bad_lines_with_errors(served, checkpoint, tmp_path,
                                                                                  capsys):
    lines = [json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})
             for cid, (url, body) in GOOD.items()]
    lines += ["{not json",
              json.dumps({"custom_id": "url", "method": "POST", "url": "/v1/nope", "body": {}}),
              json.dumps({"custom_id": "body", "method": "POST", "url": "/v1/completions",
                          "body": {**GREEDY, "prompt": "x", "max_tokens": "six"}}),
              ""]  # a blank line is skipped, as vLLM skips it
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(out), *tiny_engine_flags(checkpoint),
                 "--served-model-name", MODEL, "--chat-template", TEMPLATE]) == 0
    assert "5 lines, 2 answered, 3 errors" in capsys.readouterr().err
    results = [json.loads(t) for t in out.read_text().splitlines()]
    assert len(results) == 5
    by_id = {r["custom_id"]: r for r in results}
    for cid, (url, body) in GOOD.items():
        result = by_id[cid]
        assert result["error"] is None and result["response"]["status_code"] == 200
        assert result["id"].startswith("vllm-") and result["response"]["request_id"].startswith("vllm-batch-")
        expected = httpx.post(served.url + url, json=body, timeout=60).json()
        assert _without_ids(result["response"]["body"]) == _without_ids(expected)
    assert by_id["url"]["response"]["status_code"] == 400 and "/v1/nope" in by_id["url"]["error"]["error"]["message"]
    bad_body = httpx.post(served.url + "/v1/completions", json={**GREEDY, "prompt": "x", "max_tokens": "six"})
    assert by_id["body"]["response"]["status_code"] == bad_body.status_code == 400
    assert by_id["body"]["error"] == bad_body.json() and by_id["body"]["response"]["body"] is None
    assert "not JSON" in by_id[None]["error"]["error"]["message"]


def test_run_batch_answers_a_responses_line_as_the_server_does(served, checkpoint, tmp_path):
    """A /v1/responses line (the Responses API through the same app): the same output text as the server gives."""
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 6, "temperature": 0, "store": False}
    (tmp_path / "in.jsonl").write_text(json.dumps({"custom_id": "resp", "method": "POST", "url": "/v1/responses",
                                                   "body": body}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(out), *tiny_engine_flags(checkpoint),
                 "--served-model-name", MODEL, "--chat-template", TEMPLATE, "--disable-progress-bar"]) == 0
    [result] = [json.loads(t) for t in out.read_text().splitlines()]
    assert result["error"] is None and result["response"]["status_code"] == 200, result
    expected = httpx.post(served.url + "/v1/responses", json=body, timeout=60).json()
    got = result["response"]["body"]
    assert got["object"] == expected["object"] == "response" and got["status"] == expected["status"]
    texts = [[part["text"] for item in r["output"] for part in item.get("content", [])] for r in (got, expected)]
    assert texts[0] == texts[1] and texts[0], texts


def test_run_batch_reads_stdin_and_writes_only_output_lines_to_stdout(checkpoint, monkeypatch, capsys):
    line = json.dumps({"custom_id": "only", "method": "POST", "url": "/v1/completions",
                       "body": {**GREEDY, "prompt": "hi", "max_tokens": 2}})
    monkeypatch.setattr("sys.stdin", io.StringIO(line + "\n"))
    assert main(["run-batch", "-i", "-", "-o", "-", *tiny_engine_flags(checkpoint), "--served-model-name", MODEL,
                 "--disable-progress-bar"]) == 0
    captured = capsys.readouterr()
    [result] = [json.loads(t) for t in captured.out.splitlines()]
    assert result["custom_id"] == "only" and result["response"]["body"]["usage"]["completion_tokens"] == 2
    assert "1 lines, 1 answered, 0 errors" in captured.err and "run-batch:" not in captured.out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sample_sum(metrics_text: str, name: str) -> float:
    return sum(sample.value for family in text_string_to_metric_families(metrics_text)
               for sample in family.samples if sample.name == name)


def test_run_batch_reads_and_writes_urls_and_serves_metrics_until_the_upload(checkpoint, tmp_path):
    """vLLM's `-i URL` / `-o URL`: the input fetched with GET, the output staged in --output-tmp-dir and PUT once
    the batch is done (the staging file then removed). With --enable-metrics the engine's Prometheus series are
    served until then: a scrape at the PUT counts every answered line and every token they generated."""
    lines = [json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})
             for cid, (url, body) in GOOD.items()] + ["{not json"]
    port, scraped, stage = _free_port(), [], tmp_path / "stage"
    stage.mkdir()
    with file_server() as files:
        files.files["/batch/in.jsonl"] = ("\n".join(lines) + "\n").encode()
        files.on_put = lambda: scraped.append(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
        assert main(["run-batch", "-i", files.url + "/batch/in.jsonl", "-o", files.url + "/batch/out.jsonl",
                     "--output-tmp-dir", str(stage), "--enable-metrics", "--port", str(port),
                     *tiny_engine_flags(checkpoint), "--served-model-name", MODEL, "--chat-template", TEMPLATE,
                     "--disable-progress-bar"]) == 0
        assert files.requests == [("GET", "/batch/in.jsonl"), ("PUT", "/batch/out.jsonl")]
    results = {r["custom_id"]: r for r in map(json.loads, files.files["/batch/out.jsonl"].decode().splitlines())}
    assert set(results) == {*GOOD, None} and "not JSON" in results[None]["error"]["error"]["message"]
    assert all(results[cid]["response"]["status_code"] == 200 for cid in GOOD)
    assert not list(stage.iterdir())
    [metrics] = scraped
    assert _sample_sum(metrics, "vllm:request_success_total") == len(GOOD)
    generated = sum(results[cid]["response"]["body"]["usage"]["completion_tokens"] for cid in GOOD)
    assert _sample_sum(metrics, "vllm:generation_tokens_total") == generated > 0
    with pytest.raises(httpx.ConnectError):  # the metrics server is gone once the command returns
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)

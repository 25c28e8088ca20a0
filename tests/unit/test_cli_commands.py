"""Every `vllm-jax` command, bench's included, documents every flag it takes (--help is the reference a vLLM user
reads), and cli.py stays a dispatcher: each command's parser comes from its own module. run-batch's input and
output (local, stdin / stdout, http(s) URLs) and its --max-inflight gate, without an engine."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from tests.helpers.file_server import file_server
from vllm_jax.cli import COMMANDS, build_parser, main
from vllm_jax.commands import batch_io
from vllm_jax.commands.batch_io import output_stream, read_input_lines
from vllm_jax.commands.run_batch import run_lines

VLLM_COMMANDS = {"serve", "generate", "convert", "compile-check", "run-batch", "chat", "complete", "collect-env",
                 "bench"}
BENCHMARKS = {"serve", "latency", "throughput", "startup", "sweep"}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_command_and_benchmark_documents_every_flag():
    commands = _subcommands(build_parser())
    assert set(commands) == VLLM_COMMANDS and len(COMMANDS) == len(VLLM_COMMANDS) - 1  # chat registers complete
    benchmarks = _subcommands(commands["bench"])
    assert set(benchmarks) == BENCHMARKS
    parsers = {**commands, **{f"bench {k}": v for k, v in benchmarks.items()}}
    undocumented = {name: [a.option_strings or a.dest for a in p._actions if not a.help and a.dest != "help"]
                    for name, p in parsers.items()}
    assert all(not flags for flags in undocumented.values()), undocumented


def test_bench_takes_vllms_flag_names():
    ns = build_parser().parse_args(["bench", "serve", "--backend", "openai-chat", "--dataset-name", "sharegpt",
                                    "--dataset-path", "sg.json", "--request-rate", "4", "--max-concurrency", "8",
                                    "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,99",
                                    "--goodput", "ttft:500", "--save-result", "--result-dir", "out"])
    assert (ns.backend, ns.dataset_name, ns.request_rate, ns.max_concurrency) == ("openai-chat", "sharegpt", 4.0, 8)
    assert ns.save_result and ns.result_dir == "out" and ns.goodput == ["ttft:500"]
    ns = build_parser().parse_args(["bench", "latency", "--input-len", "32", "--batch-size", "4", "--max-model-len",
                                    "8k"])
    assert (ns.input_len, ns.batch_size, ns.max_model_len) == (32, 4, 8000)


def _batch_line(custom_id: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})


@pytest.mark.parametrize("max_inflight", [2, 6])
def test_run_batch_submits_at_most_max_inflight_lines_at_once(max_inflight):
    """An app that counts the requests it holds at once: never more than --max-inflight, and every line answered."""
    held, peak = 0, 0

    async def app(scope, receive, send):
        nonlocal held, peak
        await receive()
        held += 1
        peak = max(peak, held)
        await asyncio.sleep(0.01)
        held -= 1
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    written: list[dict] = []
    errors = asyncio.run(run_lines(app, [_batch_line(str(i)) for i in range(6)], written.append,
                                   max_inflight=max_inflight))
    assert errors == 0 and sorted(r["custom_id"] for r in written) == [str(i) for i in range(6)]
    assert peak == max_inflight


def test_run_batch_reads_an_input_url_and_puts_the_output_to_a_url(tmp_path):
    """-i URL: the GET's lines; -o URL: the lines staged in --output-tmp-dir, then one PUT with the file's length
    declared (the server reads by Content-Length), and the staging file removed."""
    with file_server() as server:
        server.files["/in.jsonl"] = b"\n".join(_batch_line(c).encode() for c in "ab") + b"\n\n"
        assert read_input_lines(server.url + "/in.jsonl") == [_batch_line("a"), _batch_line("b")]
        with pytest.raises(OSError, match="404"):
            read_input_lines(server.url + "/missing.jsonl")
        with output_stream(server.url + "/out/result.jsonl", str(tmp_path)) as out:
            out.write("line one\nline two\n")
            assert list(tmp_path.iterdir()) and ("PUT", "/out/result.jsonl") not in server.requests
        assert server.files["/out/result.jsonl"] == b"line one\nline two\n"
        assert not list(tmp_path.iterdir())


def test_run_batch_keeps_the_staged_output_when_the_upload_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(batch_io, "UPLOAD_RETRY_DELAY_S", 0.0)
    with file_server() as server:
        server.put_status = 500
        with pytest.raises(batch_io.UploadError, match="HTTP 500") as failure:
            with output_stream(server.url + "/out.jsonl?signature=SECRET", str(tmp_path)) as out:
                out.write("finished line\n")
        assert server.requests == [("PUT", "/out.jsonl?signature=SECRET")] * batch_io.UPLOAD_ATTEMPTS
        [staged] = tmp_path.iterdir()
        assert str(staged) in str(failure.value) and staged.read_text() == "finished line\n"
        assert "SECRET" not in str(failure.value)  # a pre-signed URL's credentials are never printed
        with pytest.raises(RuntimeError):  # a run that stops early uploads nothing and keeps what it wrote
            with output_stream(server.url + "/early.jsonl", str(tmp_path)) as out:
                out.write("partial\n")
                raise RuntimeError("engine died")
        assert ("PUT", "/early.jsonl") not in server.requests and len(list(tmp_path.iterdir())) == 2


def test_run_batch_refuses_an_unreadable_input_url_before_building_an_engine(capsys):
    with file_server() as server:
        assert main(["run-batch", "-i", server.url + "/nothing.jsonl?signature=SECRET", "-o", "-"]) == 2
    err = capsys.readouterr().err
    assert f"cannot read {server.url}/nothing.jsonl?…: GET failed (HTTP 404 Not Found)" in err, err
    assert "SECRET" not in err and server.requests == [("GET", "/nothing.jsonl?signature=SECRET")]

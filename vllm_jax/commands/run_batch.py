"""`vllm-jax run-batch -i IN.jsonl -o OUT.jsonl [engine flags]`: OpenAI batch lines through one engine.

Each input line is `{"custom_id", "method": "POST", "url", "body"}`; each output line, vLLM's shape, is
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`. The bodies go through the
server's own app in-process (an ASGI transport, no socket): the same request models, checks, error bodies and
serving code as `vllm-jax serve`, for every route a batch may name. Every line is submitted at once, so the
engine batches them continuously (at most `--max-inflight` at a time); a line is written as soon as it completes
(a crash loses only the lines in flight), so the output order is completion order, matched to the input by
`custom_id`. A line that is not JSON, names an unknown url or carries a bad body becomes an error line; the rest
of the file still runs. `-i` / `-o` may be http(s) URLs (batch_io.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import httpx
from tqdm import tqdm

from vllm_jax.commands.batch_io import output_stream, read_input_lines, shown
from vllm_jax.config import add_engine_args, engine_args_from_namespace

BATCH_URLS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/score",
                        "/v1/rerank", "/score", "/rerank", "/v2/rerank"})
_BASE_URL = "http://run-batch"
DEFAULT_MAX_INFLIGHT = 1024  # vLLM's default


@dataclass
class BatchLine:
    """One input line: what to send, or why it cannot be sent (`problem`, answered with status 400)."""

    custom_id: str | None
    url: str = ""
    body: dict[str, Any] | None = None
    problem: str | None = None


def parse_line(text: str) -> BatchLine:
    """The line's request, or the first thing wrong with it (the custom_id kept whenever it can be read)."""
    try:
        item = json.loads(text)
    except json.JSONDecodeError as exc:
        return BatchLine(None, problem=f"the line is not JSON: {exc}")
    if not isinstance(item, dict):
        return BatchLine(None, problem="the line must be a JSON object")
    custom_id = item.get("custom_id")
    custom_id = custom_id if isinstance(custom_id, str) else None
    line = BatchLine(custom_id, url=item.get("url"), body=item.get("body"))
    if custom_id is None:
        line.problem = "custom_id must be a string"
    elif item.get("method", "POST") != "POST":
        line.problem = f"method must be POST; got {item.get('method')!r}"
    elif line.url not in BATCH_URLS:
        line.problem = f"url {line.url!r} is not supported; use one of {', '.join(sorted(BATCH_URLS))}"
    elif not isinstance(line.body, dict):
        line.problem = "body must be a JSON object"
    elif line.body.get("stream"):
        line.problem = "stream is not supported in a batch"
    return line


def output_line(custom_id: str | None, status: int, body: Any) -> dict[str, Any]:
    """vLLM's BatchRequestOutput: a 200 carries the body in `response`, anything else the error body in `error`."""
    ok = status == 200
    return {"id": f"vllm-{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": status, "request_id": f"vllm-batch-{uuid.uuid4().hex}",
                         "body": body if ok else None},
            "error": None if ok else body}


async def run_line(client: httpx.AsyncClient, line: BatchLine) -> dict[str, Any]:
    from vllm_jax.server.errors import error_body

    if line.problem is not None:
        return output_line(line.custom_id, 400, error_body(400, line.problem))
    reply = await client.post(line.url, json=line.body)
    try:
        body = reply.json()
    except ValueError:
        body = error_body(reply.status_code, reply.text)
    return output_line(line.custom_id, reply.status_code, body)


async def run_lines(app: Any, texts: list[str], write: Callable[[dict[str, Any]], None],
                    progress: tqdm | None = None, max_inflight: int = DEFAULT_MAX_INFLIGHT) -> int:
    """Send the lines to `app`, at most `max_inflight` at a time, and `write` each output line as it completes;
    the error lines' count."""
    errors = 0
    gate = asyncio.Semaphore(max_inflight)

    async def one(client: httpx.AsyncClient, text: str) -> dict[str, Any]:
        async with gate:
            return await run_line(client, parse_line(text))

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=_BASE_URL, timeout=None) as client:
        pending = [asyncio.ensure_future(one(client, text)) for text in texts]
        for done in asyncio.as_completed(pending):
            out = await done
            errors += out["error"] is not None
            write(out)
            if progress is not None:
                progress.update(1)
    return errors


def _build_engine(ns: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The engine, the app serving it in-process and the Prometheus logger it feeds (None without
    --enable-metrics); vLLM's periodic stats line unless --disable-log-stats."""
    from vllm_jax.engine.async_llm import AsyncLLM
    from vllm_jax.engine.data_parallel import DataParallelAsyncLLM
    from vllm_jax.metrics.logging_stats import LoggingStatLogger
    from vllm_jax.metrics.prometheus import PrometheusStatLogger
    from vllm_jax.server.api_server import build_app

    args = engine_args_from_namespace(ns, ns.model)
    names = ns.served_model_name
    args.served_model_name = names[0] if names else None
    config = args.create_config()
    metrics = PrometheusStatLogger(config.model_config.served_model_name) if ns.enable_metrics else None
    stat_loggers: list[Any] = [] if metrics is None else [metrics]
    if not ns.disable_log_stats:
        stat_loggers.append(LoggingStatLogger())
    engine_cls: Any = DataParallelAsyncLLM if config.parallel_config.data_parallel_size > 1 else AsyncLLM
    engine = engine_cls(config, stat_loggers=stat_loggers)
    app = build_app(engine, served_model_names=names or [config.model_config.served_model_name], api_key=None,
                    chat_template=ns.chat_template, enable_auto_tool_choice=ns.enable_auto_tool_choice,
                    tool_call_parser=ns.tool_call_parser, responses_store_size=0,
                    log_requests=ns.enable_log_requests)
    return engine, app, metrics


async def _run(ns: argparse.Namespace, texts: list[str], out: IO[str], cleanup: contextlib.ExitStack) -> int:
    """Build and start the engine, run the lines, shut it down. The metrics server (--enable-metrics) is left
    to `cleanup`, which closes it after the output is uploaded, so a scrape sees the finished batch."""
    engine, app, metrics = _build_engine(ns)
    if metrics is not None:
        from prometheus_client import start_http_server

        metrics_server, _ = start_http_server(ns.port, addr=ns.host, registry=metrics.registry)
        cleanup.callback(metrics_server.server_close)
        cleanup.callback(metrics_server.shutdown)
        print(f"run-batch: metrics at http://{ns.host}:{ns.port}/metrics", file=sys.stderr)
    engine.start()
    try:
        await asyncio.to_thread(engine.wait_until_ready)

        def write(line: dict[str, Any]) -> None:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            out.flush()

        with tqdm(total=len(texts), desc="run-batch", unit="req", file=sys.stderr,
                  disable=ns.disable_progress_bar) as bar:
            errors = await run_lines(app, texts, write, bar, max_inflight=ns.max_inflight)
    finally:
        await engine.shutdown()
    print(f"run-batch: {len(texts)} lines, {len(texts) - errors} answered, {errors} errors", file=sys.stderr)
    return 0


def run(ns: argparse.Namespace) -> int:
    try:
        texts = read_input_lines(ns.input_file)
    except OSError as exc:
        print(f"ERROR: cannot read {shown(ns.input_file)}: {exc}", file=sys.stderr)
        return 2
    if ns.max_inflight < 1:
        print(f"ERROR: --max-inflight must be at least 1; got {ns.max_inflight}", file=sys.stderr)
        return 2
    try:
        with contextlib.ExitStack() as cleanup, output_stream(ns.output_file, ns.output_tmp_dir) as out:
            return asyncio.run(_run(ns, texts, out, cleanup))
    except ValueError as exc:  # a bad flag or model: one line, not a traceback
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the output cannot be written or uploaded
        print(f"ERROR: {shown(ns.output_file)}: {exc}", file=sys.stderr)
        return 1


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    parser = sub.add_parser(
        "run-batch", help="run a file of OpenAI batch requests through the engine (vLLM's run-batch)",
        description="Run OpenAI batch lines (custom_id, method, url, body) through one engine, all at once, and "
        "write one output line per input line as each completes.", formatter_class=formatter)
    parser.add_argument("-i", "--input-file", required=True, help="the batch's JSONL file ('-': stdin; an "
                        "http(s) URL: fetched with GET)")
    parser.add_argument("-o", "--output-file", required=True, help="where the output lines go ('-': stdout; an "
                        "http(s) URL: the whole file PUT there when the batch is done)")
    parser.add_argument("--output-tmp-dir", default=None, metavar="DIR", help="where the output for an http(s) "
                        "--output-file is staged until it is uploaded (default: the system's temporary directory)")
    parser.add_argument("--max-inflight", type=int, default=DEFAULT_MAX_INFLIGHT, metavar="N",
                        help="at most N lines submitted to the engine at once")
    parser.add_argument("--model", default=None, help="HF directory, cached hub id or .gguf file (default: the "
                        "embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="names a body's `model` may use (default: the model)")
    parser.add_argument("--chat-template", default=None, help="Jinja chat template, a file or inline "
                        "(default: the tokenizer's)")
    parser.add_argument("--enable-auto-tool-choice", action="store_true", help="parse tool calls for "
                        'tool_choice "auto" with --tool-call-parser')
    parser.add_argument("--tool-call-parser", default=None, metavar="NAME", help="hermes, llama3_json, "
                        "mistral or openai")
    parser.add_argument("--disable-progress-bar", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--enable-log-requests", action="store_true", help="log each request's prompt and "
                        "sampling parameters")
    parser.add_argument("--disable-log-stats", action="store_true", help="no periodic engine statistics line")
    parser.add_argument("--enable-metrics", action="store_true", help="serve the engine's Prometheus metrics "
                        "at http://HOST:PORT/metrics while the batch runs")
    parser.add_argument("--host", "--url", dest="host", default="127.0.0.1", help="the metrics server's address "
                        "(--url: vLLM's older name)")
    parser.add_argument("--port", type=int, default=8000, help="the metrics server's port")
    add_engine_args(parser, skip=frozenset({"served_model_name"}))
    parser.set_defaults(func=run)

"""`vllm-jax run-batch -i IN.jsonl -o OUT.jsonl [engine flags]`: OpenAI batch lines through one engine.

Each input line is `{"custom_id", "method": "POST", "url", "body"}`; each output line, vLLM's shape, is
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`. The bodies go through the
server's own app in-process (an ASGI transport, no socket): the same request models, checks, error bodies and
serving code as `vllm-jax serve`, for every route a batch may name. Every line is submitted at once, so the
engine batches them continuously; a line is written as soon as it completes (a crash loses only the lines in
flight), so the output order is completion order, matched to the input by `custom_id`. A line that is not JSON,
names an unknown url or carries a bad body becomes an error line; the rest of the file still runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import httpx
from tqdm import tqdm

from vllm_jax.config import add_engine_args, engine_args_from_namespace

BATCH_URLS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/score",
                        "/v1/rerank", "/score", "/rerank", "/v2/rerank"})
_BASE_URL = "http://run-batch"


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
                    progress: tqdm | None = None) -> int:
    """Send every line to `app` at once and `write` each output line as it completes; the error lines' count."""
    errors = 0
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=_BASE_URL, timeout=None) as client:
        pending = [asyncio.ensure_future(run_line(client, parse_line(text))) for text in texts]
        for done in asyncio.as_completed(pending):
            out = await done
            errors += out["error"] is not None
            write(out)
            if progress is not None:
                progress.update(1)
    return errors


def read_lines(path: str) -> list[str]:
    """The non-blank lines of a file, or of stdin for `-`."""
    if path == "-":
        return [t for t in sys.stdin.read().splitlines() if t.strip()]
    with open(path, encoding="utf-8") as f:
        return [t for t in f.read().splitlines() if t.strip()]


def _build_engine(ns: argparse.Namespace) -> tuple[Any, Any]:
    from vllm_jax.engine.async_llm import AsyncLLM
    from vllm_jax.engine.data_parallel import DataParallelAsyncLLM
    from vllm_jax.server.api_server import build_app

    args = engine_args_from_namespace(ns, ns.model)
    names = ns.served_model_name
    args.served_model_name = names[0] if names else None
    config = args.create_config()
    engine_cls: Any = DataParallelAsyncLLM if config.parallel_config.data_parallel_size > 1 else AsyncLLM
    engine = engine_cls(config)
    app = build_app(engine, served_model_names=names or [config.model_config.served_model_name], api_key=None,
                    chat_template=ns.chat_template, enable_auto_tool_choice=ns.enable_auto_tool_choice,
                    tool_call_parser=ns.tool_call_parser, responses_store_size=0)
    return engine, app


async def _run(ns: argparse.Namespace, texts: list[str], out: IO[str]) -> int:
    engine, app = _build_engine(ns)
    engine.start()
    try:
        await asyncio.to_thread(engine.wait_until_ready)

        def write(line: dict[str, Any]) -> None:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            out.flush()

        with tqdm(total=len(texts), desc="run-batch", unit="req", file=sys.stderr,
                  disable=ns.disable_progress_bar) as bar:
            errors = await run_lines(app, texts, write, bar)
    finally:
        await engine.shutdown()
    print(f"run-batch: {len(texts)} lines, {len(texts) - errors} answered, {errors} errors", file=sys.stderr)
    return 0


def run(ns: argparse.Namespace) -> int:
    try:
        texts = read_lines(ns.input_file)
    except OSError as exc:
        print(f"ERROR: cannot read {ns.input_file}: {exc}", file=sys.stderr)
        return 2
    out = sys.stdout if ns.output_file == "-" else open(ns.output_file, "w", encoding="utf-8")
    try:
        return asyncio.run(_run(ns, texts, out))
    except ValueError as exc:  # a bad flag or model: one line, not a traceback
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    finally:
        if out is not sys.stdout:
            out.close()


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    parser = sub.add_parser(
        "run-batch", help="run a file of OpenAI batch requests through the engine (vLLM's run-batch)",
        description="Run OpenAI batch lines (custom_id, method, url, body) through one engine, all at once, and "
        "write one output line per input line as each completes.", formatter_class=formatter)
    parser.add_argument("-i", "--input-file", required=True, help="the batch's JSONL file ('-': stdin)")
    parser.add_argument("-o", "--output-file", required=True, help="where the output lines go ('-': stdout)")
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
    add_engine_args(parser, skip=frozenset({"served_model_name"}))
    parser.set_defaults(func=run)

"""`vllm-jax bench serve`: load-test any OpenAI-compatible server (ours, vllm-router, vLLM, another engine) the way
`vllm bench serve` does, with its flag names, its result table and its `--save-result` JSON keys.

Requests stream from /v1/completions (`--backend openai`) or /v1/chat/completions (`--backend openai-chat`),
arrive as a Poisson process at `--request-rate` (a gamma one with `--burstiness` other than 1; inf: all at
once), at most `--max-concurrency` in flight. The prompts come from datasets.py, tokenized by the server's
own /tokenize (vLLM and vllm_jax both serve it; `--tokenizer` names a local one instead), so a random prompt is
exactly its length in the model's tokens; the chat backend sends it as the text /detokenize gives back. Metrics
and keys: metrics.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from vllm_jax.commands.bench.datasets import SampleRequest, add_dataset_args, sample_requests
from vllm_jax.commands.bench.metrics import METRICS, RequestResult, parse_goodput, print_table, summarize

DEFAULT_ENDPOINTS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}


def base_url(ns: argparse.Namespace) -> str:
    return (ns.base_url or f"http://{ns.host}:{ns.port}").rstrip("/")


def _headers(ns: argparse.Namespace) -> dict[str, str]:
    key = os.environ.get("OPENAI_API_KEY") or os.environ.get("VLLM_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _codec(client: httpx.Client, ns: argparse.Namespace, model: str) -> tuple[Any, Any]:
    """tokenize / detokenize: a local `--tokenizer` (for a server without /tokenize), else the server's own."""
    if ns.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(ns.tokenizer, trust_remote_code=False)
        return (lambda text: list(tokenizer.encode(text, add_special_tokens=False))), tokenizer.decode

    def tokenize(text: str) -> list[int]:
        body = {"model": model, "prompt": text, "add_special_tokens": False}
        return client.post("/tokenize", json=body).raise_for_status().json()["tokens"]

    def detokenize(ids: list[int]) -> str:
        return client.post("/detokenize", json={"model": model, "tokens": ids}).raise_for_status().json()["prompt"]

    return tokenize, detokenize


def prepare(ns: argparse.Namespace) -> tuple[str, list[SampleRequest]]:
    """The model to name and the requests to send, read from the server (its model list, its tokenizer)."""
    with httpx.Client(base_url=base_url(ns), headers=_headers(ns), timeout=60) as client:
        model = ns.model or client.get("/v1/models").raise_for_status().json()["data"][0]["id"]
        tokenize, detokenize = _codec(client, ns, model)
        requests = sample_requests(ns, tokenize)
        if ns.backend == "openai-chat":  # chat takes text: the windows of token ids, decoded
            for r in requests:
                if isinstance(r.prompt, list):
                    r.prompt = detokenize(r.prompt)
    return model, requests


def _body(ns: argparse.Namespace, model: str, request: SampleRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": request.expected_output_len, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True}}
    if ns.ignore_eos:
        body["ignore_eos"] = True
    if ns.backend == "openai-chat":
        body["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt
    return body


def _chunk_text(chunk: dict[str, Any]) -> str:
    choice = (chunk.get("choices") or [{}])[0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


async def one_request(client: httpx.AsyncClient, ns: argparse.Namespace, model: str, request: SampleRequest,
                      t0: float) -> RequestResult:
    """Stream one request and time it (`t0`: the benchmark's start, for the peaks' one-second buckets)."""
    result = RequestResult(prompt_len=request.prompt_len)
    start = last = time.perf_counter()
    result.start, texts = start - t0, []
    try:
        async with client.stream("POST", ns.endpoint, json=_body(ns, model, request)) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:200]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    result.error = str(chunk["error"].get("message", chunk["error"]))
                    return result
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if text := _chunk_text(chunk):
                    now = time.perf_counter()
                    if not texts:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    texts.append(text)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency, result.generated_text = time.perf_counter() - start, "".join(texts)
    result.output_tokens = result.output_tokens or len(texts)
    result.success = True
    return result


async def benchmark(ns: argparse.Namespace, model: str, requests: list[SampleRequest]
                    ) -> tuple[list[RequestResult], float]:
    """Send every request on the arrival schedule, at most --max-concurrency at once; results and duration."""
    limit = ns.max_concurrency or len(requests)
    gate, rng = asyncio.Semaphore(limit), random.Random(ns.seed + 1)
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=None)
    bar = tqdm(total=len(requests), desc="bench serve", unit="req", disable=ns.disable_tqdm)
    async with httpx.AsyncClient(base_url=base_url(ns), headers=_headers(ns), timeout=ns.timeout,
                                 limits=limits) as client:
        t0 = time.perf_counter()

        async def limited(request: SampleRequest) -> RequestResult:
            async with gate:
                result = await one_request(client, ns, model, request, t0)
            bar.update(1)
            return result

        tasks = []
        for request in requests:
            tasks.append(asyncio.create_task(limited(request)))
            if ns.request_rate != float("inf"):
                await asyncio.sleep(rng.gammavariate(ns.burstiness, 1.0 / (ns.request_rate * ns.burstiness)))
        results = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - t0
    bar.close()
    return results, duration


def run_benchmark(ns: argparse.Namespace, model: str, requests: list[SampleRequest]) -> dict[str, Any]:
    """One run of prepared requests: send, summarize, print the table; the saved JSON's content."""
    results, duration = asyncio.run(benchmark(ns, model, requests))
    percentiles = [float(p) for p in ns.metric_percentiles.split(",")]
    summary = summarize(results, duration, percentiles=percentiles, goodput=parse_goodput(ns.goodput))
    shown = [m for m in ns.percentile_metrics.split(",") if m in METRICS]
    print_table(summary, max_concurrency=ns.max_concurrency, shown=shown, percentiles=percentiles)
    return {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": ns.backend, "model_id": model,
            "tokenizer_id": model, "num_prompts": len(requests), "request_rate": ns.request_rate,
            "burstiness": ns.burstiness, "max_concurrency": ns.max_concurrency, **summary}


def save_result(ns: argparse.Namespace, result: dict[str, Any]) -> Path:
    """vLLM's file name unless --result-filename: BACKEND-RATEqps[-concurrencyN]-MODEL-DATE.json."""
    name = ns.result_filename
    if name is None:
        concurrency = f"-concurrency{ns.max_concurrency}" if ns.max_concurrency is not None else ""
        name = (f"{ns.backend}-{ns.request_rate}qps{concurrency}-{result['model_id'].split('/')[-1]}-"
                f"{result['date']}.json")
    path = Path(ns.result_dir or ".") / name
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {**result, "request_rate": result["request_rate"] if result["request_rate"] != float("inf") else "inf"}
    path.write_text(json.dumps(data, indent=2))
    return path


def run(ns: argparse.Namespace) -> int:
    ns.endpoint = ns.endpoint or DEFAULT_ENDPOINTS[ns.backend]
    try:
        result = run_benchmark(ns, *prepare(ns))
    except (ValueError, httpx.HTTPError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    if ns.save_result:
        print(f"saved {save_result(ns, result)}")
    return 0 if result["completed"] else 1


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """`bench serve`'s flags (bench sweep takes them too)."""
    parser.add_argument("--backend", default="openai", choices=sorted(DEFAULT_ENDPOINTS),
                        help="openai: /v1/completions; openai-chat: /v1/chat/completions")
    parser.add_argument("--base-url", default=None, help="the server's root, without /v1 (default: --host:--port)")
    parser.add_argument("--host", default="127.0.0.1", help="the server's host")
    parser.add_argument("--port", type=int, default=8000, help="the server's port")
    parser.add_argument("--endpoint", default=None, help="the route to load (default: the backend's)")
    parser.add_argument("--model", default=None, help="the model to name (default: the server's first)")
    parser.add_argument("--tokenizer", default=None, help="a local tokenizer to make the prompts with (default: the "
                        "server's /tokenize and /detokenize)")
    add_dataset_args(parser)
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="mean requests per second; inf sends them all at once")
    parser.add_argument("--burstiness", type=float, default=1.0, help="the arrivals' gamma shape (1: Poisson)")
    parser.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    parser.add_argument("--ignore-eos", action="store_true", help="generate exactly the output length")
    parser.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                        help="metrics whose percentiles the table shows: ttft, tpot, itl, e2el")
    parser.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles, e.g. 50,90,99")
    parser.add_argument("--goodput", nargs="+", default=None, metavar="METRIC:MS",
                        help="SLOs for request_goodput, e.g. ttft:500 tpot:50")
    parser.add_argument("--save-result", action="store_true", help="write the result JSON")
    parser.add_argument("--result-dir", default=None, help="where the result JSON goes (default: here)")
    parser.add_argument("--result-filename", default=None, help="its name (default: vLLM's)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--disable-tqdm", action="store_true", help="no progress bar")

"""Online serving benchmark against a running server, reported like `vllm bench serve`.

    vllm-jax serve &            # or any OpenAI-compatible server with vLLM's /tokenize
    python benchmarks/serving.py --num-prompts 64 --max-concurrency 8 --input-len 128 --output-len 128

Random dataset: a seeded stream of random words is tokenized once through the server's /tokenize, and each
prompt is a window of exactly --input-len token ids from it (sent as token ids, so the length is exact). Every
request streams from /v1/completions with ignore_eos, so it generates exactly --output-len tokens. Requests
arrive as a Poisson process at --request-rate (inf: all at once), at most --max-concurrency in flight.

Metrics per request: TTFT (time to the first streamed token), TPOT ((E2E - TTFT) / (output tokens - 1)),
ITL (every gap between streamed chunks), E2E latency; throughput over the whole run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass, field

import httpx


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)


def build_prompts(client: httpx.Client, num: int, input_len: int, seed: int) -> list[list[int]]:
    """`num` windows of `input_len` token ids from one tokenized stream of seeded random words."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(input_len * 2 + 2048)]
    resp = client.post("/tokenize", json={"prompt": " ".join(words), "add_special_tokens": False})
    resp.raise_for_status()
    tokens = resp.json()["tokens"]
    if len(tokens) < input_len:
        raise SystemExit(f"the random text tokenized to only {len(tokens)} tokens; lower --input-len")
    starts = [rng.randrange(0, len(tokens) - input_len + 1) for _ in range(num)]
    return [tokens[s:s + input_len] for s in starts]


async def one_request(client: httpx.AsyncClient, model: str, prompt: list[int], output_len: int) -> RequestResult:
    result = RequestResult(prompt_len=len(prompt))
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:200]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    result.error = chunk["error"].get("message", "error event")
                    return result
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    now = time.perf_counter()
                    if result.ttft_s == 0.0:
                        result.ttft_s = now - start
                    else:
                        result.itl_s.append(now - last)
                    last = now
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.e2e_s = time.perf_counter() - start
    result.ok = True
    return result


async def run(ns: argparse.Namespace, model: str, prompts: list[list[int]], headers: dict[str, str]
              ) -> tuple[list[RequestResult], float]:
    limits = httpx.Limits(max_connections=ns.max_concurrency or len(prompts), max_keepalive_connections=None)
    rng = random.Random(ns.seed + 1)
    gate = asyncio.Semaphore(ns.max_concurrency or len(prompts))
    async with httpx.AsyncClient(base_url=ns.base_url, headers=headers, timeout=ns.timeout, limits=limits) as client:
        async def limited(prompt: list[int]) -> RequestResult:
            async with gate:
                return await one_request(client, model, prompt, ns.output_len)

        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(limited(prompt)))
            if ns.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(ns.request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def _ms_stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]
    return {"mean": statistics.fmean(ordered) * 1e3, "median": statistics.median(ordered) * 1e3, "p99": p99 * 1e3}


def summarize(results: list[RequestResult], duration: float, max_concurrency: int | None) -> dict:
    ok = [r for r in results if r.ok]
    input_tokens = sum(r.prompt_len for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    tpot = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "successful_requests": len(ok), "failed_requests": len(results) - len(ok),
        "max_concurrency": max_concurrency, "duration_s": duration,
        "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration, "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "ttft_ms": _ms_stats([r.ttft_s for r in ok]), "tpot_ms": _ms_stats(tpot),
        "itl_ms": _ms_stats([gap for r in ok for gap in r.itl_s]), "e2el_ms": _ms_stats([r.e2e_s for r in ok]),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }


def print_report(s: dict) -> None:
    line = "{:<40}{:<10}"
    print("{s:{c}^50}".format(s=" Serving Benchmark Result ", c="="))
    print(line.format("Successful requests:", s["successful_requests"]))
    print(line.format("Failed requests:", s["failed_requests"]))
    print(line.format("Maximum request concurrency:", str(s["max_concurrency"])))
    print(line.format("Benchmark duration (s):", f"{s['duration_s']:.2f}"))
    print(line.format("Total input tokens:", s["total_input_tokens"]))
    print(line.format("Total generated tokens:", s["total_output_tokens"]))
    print(line.format("Request throughput (req/s):", f"{s['request_throughput']:.2f}"))
    print(line.format("Output token throughput (tok/s):", f"{s['output_throughput']:.2f}"))
    print(line.format("Total Token throughput (tok/s):", f"{s['total_token_throughput']:.2f}"))
    for key, title, name in (("ttft_ms", "Time to First Token", "TTFT"),
                             ("tpot_ms", "Time per Output Token (excl. 1st token)", "TPOT"),
                             ("itl_ms", "Inter-token Latency", "ITL"), ("e2el_ms", "End-to-end Latency", "E2EL")):
        print("{s:{c}^50}".format(s=title, c="-"))
        for stat in ("mean", "median", "p99"):
            print(line.format(f"{stat.capitalize() if stat != 'p99' else 'P99'} {name} (ms):", f"{s[key][stat]:.2f}"))
    print("=" * 50)
    for error in s["errors"]:
        print(f"error: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (without /v1)")
    parser.add_argument("--model", default=None, help="model name (default: the server's first model)")
    parser.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"), help="default: $VLLM_API_KEY")
    parser.add_argument("--num-prompts", type=int, default=64, help="requests to send")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="mean requests per second (Poisson arrivals); inf sends all at once")
    parser.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--output-len", type=int, default=128, help="generated tokens per request (ignore_eos)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random dataset and arrival times")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--save-result", default=None, help="also write the summary as JSON to this path")
    ns = parser.parse_args()

    headers = {"Authorization": f"Bearer {ns.api_key}"} if ns.api_key else {}
    with httpx.Client(base_url=ns.base_url, headers=headers, timeout=60) as client:
        model = ns.model or client.get("/v1/models").raise_for_status().json()["data"][0]["id"]
        prompts = build_prompts(client, ns.num_prompts, ns.input_len, ns.seed)
    results, duration = asyncio.run(run(ns, model, prompts, headers))
    summary = summarize(results, duration, ns.max_concurrency)
    print_report(summary)
    if ns.save_result:
        with open(ns.save_result, "w") as f:
            json.dump({"args": vars(ns) | {"request_rate": str(ns.request_rate)}, **summary,
                       "requests": [asdict(r) | {"itl_s": None} for r in results]}, f, indent=2)


if __name__ == "__main__":
    main()

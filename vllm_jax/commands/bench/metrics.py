"""`bench serve`'s numbers under vLLM's result keys, so a dashboard reading `vllm bench serve --save-result` JSON
reads ours: `completed`, `failed`, `request_throughput`, `output_throughput`, `total_token_throughput`, and for
each of ttft / tpot / itl / e2el `mean_*_ms`, `median_*_ms`, `std_*_ms` and `p<P>_*_ms` per `--metric-percentiles`.

TTFT is the time to the first streamed token, TPOT (E2E - TTFT) / (output tokens - 1), ITL every gap between
streamed chunks, E2EL the whole request. Goodput counts the requests that meet every `--goodput` SLO (in ms).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

METRICS = ("ttft", "tpot", "itl", "e2el")
TITLES = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
          "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}


@dataclass
class RequestResult:
    """One request as the client saw it (times in seconds; `start` since the benchmark began)."""

    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    generated_text: str = ""
    start: float = 0.0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """vLLM's `--goodput ttft:500 tpot:50`: an SLO in ms per metric."""
    slos = {}
    for item in items or []:
        name, _, value = item.partition(":")
        if name not in METRICS or not value:
            raise ValueError(f"--goodput {item!r}: use METRIC:MS with METRIC one of {', '.join(METRICS)}")
        slos[name] = float(value)
    return slos


def _meets(result: RequestResult, slos: dict[str, float]) -> bool:
    values = {"ttft": result.ttft, "tpot": result.tpot or 0.0, "e2el": result.latency,
              "itl": max(result.itl, default=0.0)}
    return all(values[name] * 1e3 <= limit for name, limit in slos.items())


def _peaks(results: list[RequestResult]) -> tuple[float, int]:
    """The most output tokens in any one second of the run, and the most requests in flight at any moment."""
    tokens: dict[int, int] = {}
    events: list[tuple[float, int]] = []  # (time, +1 start / -1 end); at a tie the end sorts first
    for r in results:
        if not r.success:
            continue
        for moment in itertools.accumulate(r.itl, initial=r.start + r.ttft):
            tokens[int(moment)] = tokens.get(int(moment), 0) + 1
        events += [(r.start, 1), (r.start + r.latency, -1)]
    in_flight = list(itertools.accumulate(change for _, change in sorted(events)))
    return float(max(tokens.values(), default=0)), max(in_flight, default=0)


def _stats(name: str, values_s: list[float], percentiles: list[float]) -> dict[str, float]:
    ms = sorted(v * 1e3 for v in values_s) or [0.0]
    stats = {f"mean_{name}_ms": statistics.fmean(ms), f"median_{name}_ms": statistics.median(ms),
             f"std_{name}_ms": statistics.pstdev(ms)}
    for p in percentiles:
        rank = min(len(ms) - 1, max(0, math.ceil(p / 100 * len(ms)) - 1))
        stats[f"p{p:g}_{name}_ms"] = ms[rank]
    return stats


def summarize(results: list[RequestResult], duration: float, *, percentiles: list[float],
              goodput: dict[str, float]) -> dict[str, Any]:
    ok = [r for r in results if r.success]
    inputs, outputs = sum(r.prompt_len for r in ok), sum(r.output_tokens for r in ok)
    peak_tokens, peak_requests = _peaks(results)
    summary: dict[str, Any] = {
        "duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
        "total_input_tokens": inputs, "total_output_tokens": outputs,
        "request_throughput": len(ok) / duration,
        "request_goodput": sum(_meets(r, goodput) for r in ok) / duration if goodput else None,
        "output_throughput": outputs / duration, "total_token_throughput": (inputs + outputs) / duration,
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_requests,
    }
    per_metric = {"ttft": [r.ttft for r in ok], "tpot": [t for r in ok if (t := r.tpot) is not None],
                  "itl": [gap for r in ok for gap in r.itl], "e2el": [r.latency for r in ok]}
    for name in METRICS:
        summary.update(_stats(name, per_metric[name], percentiles))
    summary.update({"input_lens": [r.prompt_len for r in results], "output_lens": [r.output_tokens for r in results],
                    "ttfts": [r.ttft for r in results], "itls": [r.itl for r in results],
                    "generated_texts": [r.generated_text for r in results], "errors": [r.error for r in results]})
    return summary


def print_table(s: dict[str, Any], *, max_concurrency: int | None, shown: list[str], percentiles: list[float]) -> None:
    """vLLM's result table: the totals, then each metric of `--percentile-metrics`."""
    row = "{:<40}{:<10}"
    print("{s:{c}^50}".format(s=" Serving Benchmark Result ", c="="))
    for title, value in (("Successful requests:", s["completed"]), ("Failed requests:", s["failed"]),
                         ("Maximum request concurrency:", max_concurrency),
                         ("Benchmark duration (s):", f"{s['duration']:.2f}"),
                         ("Total input tokens:", s["total_input_tokens"]),
                         ("Total generated tokens:", s["total_output_tokens"]),
                         ("Request throughput (req/s):", f"{s['request_throughput']:.2f}"),
                         ("Request goodput (req/s):", None if s["request_goodput"] is None
                          else f"{s['request_goodput']:.2f}"),
                         ("Output token throughput (tok/s):", f"{s['output_throughput']:.2f}"),
                         ("Peak output token throughput (tok/s):", f"{s['max_output_tokens_per_s']:.2f}"),
                         ("Peak concurrent requests:", f"{s['max_concurrent_requests']:.2f}"),
                         ("Total Token throughput (tok/s):", f"{s['total_token_throughput']:.2f}")):
        if value is not None or title.startswith("Maximum"):
            print(row.format(title, str(value)))
    for name in shown:
        print("{s:{c}^50}".format(s=TITLES[name], c="-"))
        label = name.upper()
        print(row.format(f"Mean {label} (ms):", f"{s[f'mean_{name}_ms']:.2f}"))
        print(row.format(f"Median {label} (ms):", f"{s[f'median_{name}_ms']:.2f}"))
        for p in percentiles:
            print(row.format(f"P{p:g} {label} (ms):", f"{s[f'p{p:g}_{name}_ms']:.2f}"))
    print("=" * 50)

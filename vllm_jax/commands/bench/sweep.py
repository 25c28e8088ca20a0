"""`vllm-jax bench sweep`: `bench serve` once per load (`--request-rates` or `--max-concurrencies`), the same
prompts each time, then one JSON of every run's results and a PNG of throughput and TTFT / TPOT (median and
P99) against the load, both in `--output-dir`. The plot needs matplotlib (`pip install vllm-jax[plot]`); without
it the sweep still writes the JSON and says so.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from vllm_jax.commands.bench.serve import DEFAULT_ENDPOINTS, add_serve_args, prepare, run_benchmark

# the per-request lists stay out of the sweep's JSON: one line per run is what a sweep compares
_PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


def sweep(ns: argparse.Namespace) -> list[dict[str, Any]]:
    """One bench-serve result per load value, in order."""
    model, requests = prepare(ns)
    runs = []
    for value in ns.request_rates or ns.max_concurrencies:
        point = copy.copy(ns)
        if ns.request_rates:
            point.request_rate = value
        else:
            point.max_concurrency = int(value)
        print(f"--- {ns.load_name} {value}")
        result = run_benchmark(point, model, copy.deepcopy(requests))
        runs.append({"load": value, **{k: v for k, v in result.items() if k not in _PER_REQUEST}})
    return runs


def plot(runs: list[dict[str, Any]], load_name: str, path: Path) -> bool:
    """Throughput and latency against load as a PNG; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    loads = [str(r["load"]) for r in runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(loads, [r["output_throughput"] for r in runs], marker="o", label="output tok/s")
    left.plot(loads, [r["total_token_throughput"] for r in runs], marker="o", label="total tok/s")
    left.set(xlabel=load_name, ylabel="tokens / s", title="Throughput")
    for key, label in (("median_ttft_ms", "TTFT median"), ("p99_ttft_ms", "TTFT P99"),
                       ("median_tpot_ms", "TPOT median"), ("p99_tpot_ms", "TPOT P99")):
        right.plot(loads, [r.get(key, 0.0) for r in runs], marker="o", label=label)
    right.set(xlabel=load_name, ylabel="ms", title="Latency", yscale="log")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def run(ns: argparse.Namespace) -> int:
    if bool(ns.request_rates) == bool(ns.max_concurrencies):
        print("ERROR: give exactly one of --request-rates and --max-concurrencies", file=sys.stderr)
        return 2
    if "99" not in ns.metric_percentiles.split(","):
        ns.metric_percentiles += ",99"  # the plot's P99 lines
    ns.load_name = "request rate (req/s)" if ns.request_rates else "max concurrency"
    ns.endpoint = ns.endpoint or DEFAULT_ENDPOINTS[ns.backend]
    try:
        runs = sweep(ns)
    except (ValueError, httpx.HTTPError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    out = Path(ns.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = [{**r, "request_rate": str(r["request_rate"]), "load": str(r["load"])} for r in runs]
    (out / "sweep.json").write_text(json.dumps(data, indent=2))
    drawn = plot(runs, ns.load_name, out / "sweep.png")
    print(f"wrote {out / 'sweep.json'}" + (f" and {out / 'sweep.png'}" if drawn else
                                          " (no plot: install matplotlib, `pip install vllm-jax[plot]`)"))
    return 0 if all(r["completed"] for r in runs) else 1


def add_args(parser: argparse.ArgumentParser) -> None:
    add_serve_args(parser)
    parser.add_argument("--request-rates", type=float, nargs="+", default=None, metavar="RATE",
                        help="the request rates to run (inf: all at once)")
    parser.add_argument("--max-concurrencies", type=int, nargs="+", default=None, metavar="N",
                        help="the concurrencies to run (at the --request-rate)")
    parser.add_argument("--output-dir", default="bench-sweep", help="where sweep.json and sweep.png go")

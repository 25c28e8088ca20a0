"""`vllm-jax bench startup`: how long the offline engine takes to start, cold (an empty compilation cache: every
warm-up program compiles) and warm (the programs load from the cache a first run wrote), as `vllm bench startup`
reports it. Each start runs in a fresh process, so nothing in memory (jax's own caches) carries over; the time
is that of building the LLM (load, KV sizing, warm-up), the imports excluded.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import tempfile
from typing import Any

import numpy as np

from vllm_jax.commands.bench.offline import add_offline_args, fail, write_json
from vllm_jax.config import engine_args_from_namespace

PERCENTILES = (10, 25, 50, 75, 90, 99)


def _start_once(kwargs: dict[str, Any], results: Any) -> None:
    """In a fresh process: build the LLM, report the seconds it took."""
    import time

    from vllm_jax.llm import LLM

    start = time.perf_counter()
    LLM(**kwargs)
    results.put(time.perf_counter() - start)


def time_starts(kwargs: dict[str, Any], cache_dir: str | None, count: int) -> list[float]:
    """`count` starts, each in its own process, with the compilation cache at `cache_dir` (None: a fresh empty
    directory per start, so each is cold)."""
    context = multiprocessing.get_context("spawn")
    seconds = []
    for _ in range(count):
        with tempfile.TemporaryDirectory(prefix="vllm_jax_startup_") as fresh:
            results = context.Queue()
            child = context.Process(target=_start_once,
                                    args=({**kwargs, "compilation_cache_dir": cache_dir or fresh}, results))
            child.start()
            child.join()
            if child.exitcode != 0:
                raise RuntimeError(f"the engine did not start (exit code {child.exitcode})")
            seconds.append(results.get())
    return seconds


def _report(name: str, seconds: list[float]) -> dict[str, Any]:
    print(f"Avg {name} startup time: {np.mean(seconds):.2f} seconds")
    percentiles = {str(p): float(np.percentile(seconds, p)) for p in PERCENTILES}
    for p, value in percentiles.items():
        print(f"{p}% percentile {name} startup time: {value:.2f} seconds")
    return {f"avg_{name}_startup_time": float(np.mean(seconds)), f"{name}_startup_times": seconds,
            f"{name}_startup_percentiles": percentiles}


def run(ns: argparse.Namespace) -> int:
    args = engine_args_from_namespace(ns, ns.model)
    try:
        args.create_config()
    except ValueError as exc:
        return fail(exc)
    kwargs = dataclasses.asdict(args)
    cold = time_starts(kwargs, None, ns.num_iters_cold)
    with tempfile.TemporaryDirectory(prefix="vllm_jax_startup_warm_") as cache:
        time_starts(kwargs, cache, ns.num_iters_warmup)  # fills the cache
        warm = time_starts(kwargs, cache, ns.num_iters_warm)
    result = {**_report("cold", cold), **_report("warm", warm)}
    write_json(ns.output_json, result)
    return 0


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-iters-cold", type=int, default=3, help="starts with an empty compilation cache")
    parser.add_argument("--num-iters-warmup", type=int, default=1, help="untimed starts that fill the cache")
    parser.add_argument("--num-iters-warm", type=int, default=3, help="timed starts from the filled cache")
    add_offline_args(parser)

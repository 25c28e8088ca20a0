"""Decode throughput and mid-chunk TTFT with multi-step decoding (--num-scheduler-steps K).

    python benchmarks/multi_step.py [--model M] [--steps 1 4 8] [--batches 1 8] [--input-len 128]
                                    [--output-len 128] [--arrivals 8] [engine flags]

One engine per K, all built first; for each batch size B (runs interleaved over K, best of --repeats), B
requests with random prompts generate --output-len tokens (ignore_eos, greedy). Decode tok/s counts the tokens
after each request's first one, over the time from the step that gave the last first token to the end, so
prefill is left out. Then --arrivals requests arrive one at a time at random moments while
min(B, max_num_seqs - 1) others decode (B: the largest batch): a timer thread stamps the arrival, the engine
takes the request at its next step boundary (as the server's engine loop does), and TTFT is first token -
arrival. With K > 1 the arrival waits for the chunk in flight (docs/architecture/05-worker.md, "Several decode
steps per dispatch"), so TTFT grows by at most one chunk's time. Prints one JSON line per (K, B) and per K for
TTFT.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import threading
import time

import numpy as np
from engine_share import device_share

from vllm_jax.config import add_engine_args, engine_args_from_namespace


def decode_rate(engine, prompts: list[list[int]], output_len: int) -> dict:
    from vllm_jax import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"d{i}", prompt, params)
    started: set[str] = set()
    t_first = None
    steps = 0
    while engine.has_work():
        outs = engine.step()
        steps += 1
        for out in outs:
            if out.outputs[0].token_ids and out.request_id not in started:
                started.add(out.request_id)
                if len(started) == len(prompts):
                    t_first = time.perf_counter()
    elapsed = time.perf_counter() - t_first
    tokens = len(prompts) * (output_len - 1)
    return {"batch": len(prompts), "decode_tok_s": round(tokens / elapsed, 2), "steps": steps}


def mid_chunk_ttft(engine, prompts: list[list[int]], new_prompt: list[int], arrivals: int) -> list[float]:
    """TTFT of requests arriving at random moments while `prompts` decode (to the context's end: they outlast
    the arrivals; the caller leaves a free row so an arrival is admitted at the next step)."""
    from vllm_jax import SamplingParams

    one = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    rng = random.Random(0)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bg{i}", prompt, SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))
    for _ in range(3):
        engine.step()
    ttfts: list[float] = []
    arrived: list[float] = []
    for n in range(arrivals):
        timer = threading.Timer(rng.uniform(0.0, 0.2), lambda: arrived.append(time.perf_counter()))
        timer.start()
        added = None
        while len(ttfts) <= n:
            if added is None and len(arrived) > n:
                added = arrived[n]
                engine.add_request(f"new{n}", new_prompt, one)
            for out in engine.step():
                if out.request_id == f"new{n}" and out.outputs[0].token_ids and len(ttfts) <= n:
                    ttfts.append(time.perf_counter() - added)
        timer.join()
    engine.abort_request([f"bg{i}" for i in range(len(prompts))])
    while engine.has_work():
        engine.step()
    return ttfts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--arrivals", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="runs per (K, B), interleaved over K; best kept")
    add_engine_args(parser, skip=frozenset({"num_scheduler_steps"}))
    ns = parser.parse_args()

    from vllm_jax import LLM

    rng = np.random.default_rng(0)
    base = engine_args_from_namespace(ns, ns.model)
    # Every engine first, then the runs interleaved over K: a shared machine's load drifts, and each K then sees
    # the same drift.
    share = device_share(len(ns.steps), base.gpu_memory_utilization)
    engines = {k: LLM(**{**dataclasses.asdict(base), **share, "num_scheduler_steps": k}).llm_engine
               for k in ns.steps}
    vocab = engines[ns.steps[0]].vocab_size
    for batch in ns.batches:
        best: dict[int, dict] = {}
        for _ in range(ns.repeats):
            prompts = [rng.integers(3, vocab, ns.input_len).tolist() for _ in range(batch)]
            for k, engine in engines.items():
                row = decode_rate(engine, prompts, ns.output_len)
                if k not in best or row["decode_tok_s"] > best[k]["decode_tok_s"]:
                    best[k] = row
        for k, row in best.items():
            print(json.dumps({"num_scheduler_steps": k, **row, "best_of": ns.repeats}), flush=True)
    if ns.arrivals:
        decoders = min(max(ns.batches), base.max_num_seqs - 1) if base.max_num_seqs else max(ns.batches)
        prompts = [rng.integers(3, vocab, ns.input_len).tolist() for _ in range(decoders)]
        new_prompt = rng.integers(3, vocab, ns.input_len).tolist()
        for k, engine in engines.items():
            ttfts = mid_chunk_ttft(engine, prompts, new_prompt, ns.arrivals)
            print(json.dumps({"num_scheduler_steps": k, "decoding": decoders, "arrivals": len(ttfts),
                              "ttft_ms_mean": round(1000 * float(np.mean(ttfts)), 1),
                              "ttft_ms_max": round(1000 * float(np.max(ttfts)), 1)}), flush=True)


if __name__ == "__main__":
    main()

"""`vllm-jax bench latency`: how long one batch takes from submission to its last token on the offline engine,
as `vllm bench latency` measures it (`--batch-size` prompts of `--input-len` random token ids, each generating
exactly `--output-len` tokens; `--num-iters-warmup` untimed runs, then `--num-iters` timed ones)."""

from __future__ import annotations

import argparse
import time

import numpy as np

from vllm_jax.commands.bench.offline import add_offline_args, build_llm, fail, write_json

PERCENTILES = (10, 25, 50, 75, 90, 99)


def run(ns: argparse.Namespace) -> int:
    from vllm_jax.sampling_params import SamplingParams

    try:
        llm = build_llm(ns)
    except ValueError as exc:
        return fail(exc)
    rng = np.random.default_rng(ns.seed)
    vocab = llm.get_tokenizer().vocab_size
    prompts = [{"prompt_token_ids": rng.integers(0, vocab, ns.input_len).tolist()} for _ in range(ns.batch_size)]
    params = SamplingParams(n=ns.n, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=ns.output_len)

    def once() -> float:
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    for _ in range(ns.num_iters_warmup):
        once()
    latencies = [once() for _ in range(ns.num_iters)]
    result = {"avg_latency": float(np.mean(latencies)), "latencies": latencies,
              "percentiles": {str(p): float(np.percentile(latencies, p)) for p in PERCENTILES}}
    print(f"Avg latency: {result['avg_latency']:.4f} seconds")
    for p, value in result["percentiles"].items():
        print(f"{p}% percentile latency: {value:.4f} seconds")
    write_json(ns.output_json, result)
    return 0


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input-len", type=int, default=32, help="prompt tokens per request")
    parser.add_argument("--output-len", type=int, default=128, help="generated tokens per request")
    parser.add_argument("--batch-size", type=int, default=8, help="requests in the batch")
    parser.add_argument("--n", type=int, default=1, help="completions per request")
    parser.add_argument("--num-iters-warmup", type=int, default=10, help="untimed runs first")
    parser.add_argument("--num-iters", type=int, default=30, help="timed runs")
    add_offline_args(parser)

"""`vllm-jax bench throughput`: how fast the offline engine gets through a whole dataset, as `vllm bench
throughput` reports it (requests/s, total and output tokens/s, vLLM's JSON keys), plus what this engine adds:
the start-up and warm-up seconds and the programs compiled during the run (it must stay 0)."""

from __future__ import annotations

import argparse
import time

from vllm_jax.commands.bench.datasets import add_dataset_args, sample_requests
from vllm_jax.commands.bench.offline import add_offline_args, build_llm, fail, write_json


def run(ns: argparse.Namespace) -> int:
    from vllm_jax.sampling_params import SamplingParams

    if ns.input_len is not None:
        ns.random_input_len = ns.input_len
    if ns.output_len is not None:
        ns.random_output_len = ns.sharegpt_output_len = ns.output_len
    t0 = time.perf_counter()
    try:
        llm = build_llm(ns)
        tokenizer = llm.get_tokenizer()
        requests = sample_requests(ns, lambda text: list(tokenizer.encode(text, add_special_tokens=False)))
    except ValueError as exc:
        return fail(exc)
    startup = time.perf_counter() - t0
    engine = llm.llm_engine
    compiles_before = engine.runner.num_compilations
    prompts = [{"prompt_token_ids": r.prompt} if isinstance(r.prompt, list) else r.prompt for r in requests]
    params = [SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=r.expected_output_len)
              for r in requests]
    t1 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=not ns.disable_tqdm)
    elapsed = time.perf_counter() - t1
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    total_tokens = output_tokens + sum(r.prompt_len for r in requests)
    result = {"elapsed_time": elapsed, "num_requests": len(requests), "total_num_tokens": total_tokens,
              "requests_per_second": len(requests) / elapsed, "tokens_per_second": total_tokens / elapsed,
              "output_tokens_per_second": output_tokens / elapsed, "startup_seconds": startup,
              "warmup_seconds": engine.warmup_seconds,
              "compilations_during_run": engine.runner.num_compilations - compiles_before}
    print(f"Throughput: {result['requests_per_second']:.2f} requests/s, {result['tokens_per_second']:.2f} total "
          f"tokens/s, {result['output_tokens_per_second']:.2f} output tokens/s")
    print(f"Total num prompt tokens: {total_tokens - output_tokens}\nTotal num output tokens: {output_tokens}")
    print(f"Start-up {startup:.1f} s (warm-up {engine.warmup_seconds:.1f} s); compilations during the run: "
          f"{result['compilations_during_run']}")
    write_json(ns.output_json, result)
    return 0


def add_args(parser: argparse.ArgumentParser) -> None:
    add_dataset_args(parser)
    parser.add_argument("--input-len", type=int, default=None, help="prompt tokens per request (sets "
                        "--random-input-len)")
    parser.add_argument("--output-len", type=int, default=None, help="output tokens per request (sets "
                        "--random-output-len and --sharegpt-output-len)")
    parser.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    add_offline_args(parser, seed_added=True)

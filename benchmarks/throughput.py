"""Offline throughput, reported like `vllm bench throughput`.

    python benchmarks/throughput.py --num-prompts 64 --input-len 128 --output-len 128 [engine flags]

Random prompts (token ids drawn with a fixed seed), every request generates exactly --output-len tokens
(ignore_eos). Prints requests/s, total tokens/s and output tokens/s, plus warm-up seconds and the compile
count before and after the run (it must not move).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

from vllm_jax.config import add_engine_args, engine_args_from_namespace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--dataset-seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)
    add_engine_args(parser)
    ns = parser.parse_args()

    from vllm_jax import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(**dataclasses.asdict(engine_args_from_namespace(ns, ns.model)))
    startup = time.perf_counter() - t0
    engine = llm.llm_engine
    compiles_before = engine.runner.num_compilations

    rng = np.random.default_rng(ns.dataset_seed)
    vocab = engine.vocab_size
    prompts = [{"prompt_token_ids": rng.integers(0, vocab, ns.input_len).tolist()} for _ in range(ns.num_prompts)]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=ns.output_len, ignore_eos=True)

    t1 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    elapsed = time.perf_counter() - t1
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    total_tokens = out_tokens + ns.input_len * ns.num_prompts
    result = {
        "num_prompts": ns.num_prompts, "input_len": ns.input_len, "output_len": ns.output_len,
        "elapsed_s": elapsed, "requests_per_s": ns.num_prompts / elapsed,
        "total_tokens_per_s": total_tokens / elapsed, "output_tokens_per_s": out_tokens / elapsed,
        "startup_s": startup, "warmup_s": engine.warmup_seconds,
        "compilations_warmup": compiles_before, "compilations_after_run": engine.runner.num_compilations,
        "num_kv_blocks": engine.runner.num_blocks, "num_preemptions": engine.scheduler.num_preemptions_total,
    }
    print(f"Throughput: {result['requests_per_s']:.2f} requests/s, {result['total_tokens_per_s']:.2f} total "
          f"tokens/s, {result['output_tokens_per_s']:.2f} output tokens/s")
    print(f"Start-up {startup:.1f} s (warm-up {engine.warmup_seconds:.1f} s, {compiles_before} programs compiled); "
          f"compilations during the run: {result['compilations_after_run'] - compiles_before}; "
          f"preemptions: {result['num_preemptions']}")
    if ns.output_json:
        with open(ns.output_json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

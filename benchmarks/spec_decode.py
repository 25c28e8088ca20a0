"""Speculative decoding (n-gram) on the default model: output tok/s without and with it, in one run.

Workloads (greedy, chat-formatted): "grounded" asks to rewrite, continue or edit a given passage or function, so the
answer repeats its input; "free" asks for text not in the prompt. Batch 1 runs the prompts one at a time; batch
32 runs 32 requests of a workload together, where verifying k extra tokens per request costs compute that a CPU does
not have spare. Reports output tok/s off and on (and the speed-up), the acceptance rate (accepted / proposed
tokens), the mean accepted length (tokens per verifying step: 1 + accepted / drafts, vLLM's definition) and
whether the greedy outputs agree (they must).

    python benchmarks/spec_decode.py [--model PATH] [--k 4] [--max-tokens 128] [--batch 8 32] [--json out.json]

Proposals need logits rows (requests plus proposals stay within max_num_seqs), so max_num_seqs defaults to the
largest batch x (1 + k): at max_num_seqs = batch a full batch has no room for proposals and runs unspeculated.
"""

from __future__ import annotations

import argparse
import json
import time

from engine_share import device_share

from vllm_jax import LLM, SamplingParams

PASSAGE = ("The lighthouse stood at the edge of the cliff for more than a century. Every night its keeper climbed "
           "the hundred and twelve steps, trimmed the wick and wound the clockwork that turned the great lens. "
           "Ships passing the headland counted the flashes, three short and one long, and knew where they were. "
           "When the keeper grew old, his daughter took over the climb, and the light never failed.")
CODE = '''def mean(values):
    total = 0
    for v in values:
        total = total + v
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for v in values:
        total = total + (v - m) * (v - m)
    return total / len(values)
'''
GROUNDED = [
    f"Repeat the following passage exactly, word for word:\n\n{PASSAGE}",
    f"Rewrite this passage in the past perfect tense, changing nothing else:\n\n{PASSAGE}",
    f"Add type hints to these Python functions and return the full code:\n\n{CODE}",
    f"Rename the variable `total` to `acc` in this code and return the full code:\n\n{CODE}",
]
FREE = [
    "Write a short story about a dragon who learns to paint.",
    "Explain why the sky is blue to a ten-year-old.",
    "List ten ideas for a weekend trip and say why each is fun.",
    "Describe how bread is made, step by step.",
]


def _generate(llm: LLM, prompts: list[str], params: SamplingParams) -> tuple[list[list[int]], float]:
    start = time.perf_counter()
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], time.perf_counter() - start


def _measure(llm: LLM, prompts: list[str], params: SamplingParams, batch: int) -> dict:
    """Output tok/s over `prompts` (one at a time at batch 1, else all at once) and the speculation counts."""
    counts = llm.llm_engine.scheduler.spec_decode_counts
    before = (counts.num_drafts, counts.num_draft_tokens, counts.num_accepted_tokens)
    tokens: list[list[int]] = []
    elapsed = 0.0
    groups = [[p] for p in prompts] if batch == 1 else [prompts]
    for group in groups:
        out, seconds = _generate(llm, group, params)
        tokens += out
        elapsed += seconds
    drafts, drafted, accepted = (now - then for now, then in zip(
        (counts.num_drafts, counts.num_draft_tokens, counts.num_accepted_tokens), before))
    return {"tokens": tokens, "tok_s": sum(map(len, tokens)) / elapsed, "drafts": drafts, "drafted": drafted,
            "accepted": accepted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, nargs="*", default=[32], help="larger batch sizes to run (none: skip)")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="default: the largest batch x (1 + k), so proposals always have logits rows")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    largest = max(args.batch, default=1)
    max_num_seqs = args.max_num_seqs or largest * (args.k + 1)
    engine_args = dict(max_model_len=1024, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max(512, max_num_seqs), **device_share(2))
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": args.prompt_lookup_max,
            "prompt_lookup_min": args.prompt_lookup_min}
    llms = {"off": LLM(args.model, **engine_args), "on": LLM(args.model, speculative_config=spec, **engine_args)}
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for llm in llms.values():  # every program compiled, caches warm
        _generate(llm, GROUNDED[:1], SamplingParams(temperature=0.0, max_tokens=8))
    runs = [("grounded", GROUNDED, 1), ("free", FREE, 1)]
    for batch in args.batch:
        runs += [("grounded", (GROUNDED * batch)[:batch], batch), ("free", (FREE * batch)[:batch], batch)]
    rows = []
    print(f"n-gram k={args.k}, prompt_lookup {args.prompt_lookup_min}..{args.prompt_lookup_max}, "
          f"max_tokens={args.max_tokens}, max_num_seqs={max_num_seqs}")
    print(f"{'workload':<10} {'batch':>5} {'off tok/s':>10} {'on tok/s':>10} {'speed-up':>9} {'accept':>7} "
          f"{'mean len':>9} {'same':>5}")
    for name, prompts, batch in runs:
        off, on = (_measure(llms[mode], prompts, params, batch) for mode in ("off", "on"))
        row = {"workload": name, "batch": batch, "off_tok_s": off["tok_s"], "on_tok_s": on["tok_s"],
               "speedup": on["tok_s"] / off["tok_s"],
               "acceptance_rate": on["accepted"] / max(on["drafted"], 1),
               "mean_accepted_length": 1 + on["accepted"] / max(on["drafts"], 1),
               "same_tokens": off["tokens"] == on["tokens"]}
        rows.append(row)
        print(f"{name:<10} {batch:>5} {row['off_tok_s']:>10.1f} {row['on_tok_s']:>10.1f} {row['speedup']:>8.2f}x "
              f"{row['acceptance_rate']:>7.2f} {row['mean_accepted_length']:>9.2f} {str(row['same_tokens']):>5}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"k": args.k, "max_tokens": args.max_tokens, "max_num_seqs": max_num_seqs, "rows": rows}, f,
                      indent=2)


if __name__ == "__main__":
    main()

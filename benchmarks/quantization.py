"""--quantization on the default model: decode tok/s, param bytes and greedy agreement vs float32, in one run.

`--schemes none gguf` compares the default GGUF dequantized to float32 with its blocks kept (Q4_1 layers, Q8_0
embedding and tied LM head: --quantization gguf).

Each scheme (float32, int8, fp8 by default) gets its own engine, all alive at once; the timed runs interleave the
schemes round by round and keep each one's best round, so the ratios come from the same minutes of a noisy machine.
Batch 1 decodes one request at a time, batch N decodes N requests together (greedy, ignore_eos, a short chat prompt,
so the time is decode). Reported per scheme: output tok/s and its ratio to float32, the params' device bytes
(embedding and LM head included: float for int8 / fp8, kept for gguf), the weight bytes a decode step reads per
output token (params / batch), and how the README's example prompts' answers compare with the first scheme's
(float32): the greedy tokens' common prefix (one early flip makes the rest differ), and the teacher-forced top-1
agreement (each scheme reads float32's greedy answers as prompts, with prompt_logprobs=1, and its argmax at each
answer position is compared with float32's token there), which does not compound a flip.

    python benchmarks/quantization.py [--model PATH] [--schemes none int8 fp8] [--batch 8] [--max-tokens 64]
                                      [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import jax

from vllm_jax import LLM, SamplingParams
from vllm_jax.commands.generate import DEFAULT_PROMPTS

DECODE_PROMPT = "Tell me about the ocean."


def _chat(llm: LLM, prompts: list[str], params: SamplingParams) -> tuple[list[list[int]], float]:
    start = time.perf_counter()
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], time.perf_counter() - start


def _tok_s(llm: LLM, batch: int, max_tokens: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    tokens, seconds = _chat(llm, [DECODE_PROMPT] * batch, params)
    return sum(map(len, tokens)) / seconds


def _common_prefix(tokens: list[list[int]], reference: list[list[int]]) -> int:
    """Common-prefix tokens, summed over the prompts."""
    prefix = 0
    for mine, ref in zip(tokens, reference):
        n = 0
        while n < min(len(mine), len(ref)) and mine[n] == ref[n]:
            n += 1
        prefix += n
    return prefix


def _teacher_forced(llm: LLM, prompts: list[list[int]], answers: list[list[int]]) -> int:
    """Positions of `answers` (read after `prompts`) where `llm`'s argmax is the answer's token."""
    inputs = [{"prompt_token_ids": p + a} for p, a in zip(prompts, answers)]
    outs = llm.generate(inputs, SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False)
    agree = 0
    for out, prompt, answer in zip(outs, prompts, answers):
        for i, token in enumerate(answer):
            ranked = out.prompt_logprobs[len(prompt) + i]
            agree += min(ranked.items(), key=lambda kv: kv[1].rank)[0] == token
    return agree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--schemes", nargs="+", default=["none", "int8", "fp8"],
                        help="none is float32; int8, fp8, gguf (a GGUF's blocks kept)")
    parser.add_argument("--batch", type=int, default=8, help="the larger batch (batch 1 always runs)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    engine_args = dict(max_model_len=512, max_num_seqs=max(8, args.batch), max_num_batched_tokens=256,
                       kv_cache_memory_bytes=256 << 20)
    llms = {}
    for scheme in args.schemes:
        t0 = time.perf_counter()
        llms[scheme] = LLM(args.model, quantization=None if scheme == "none" else scheme, **engine_args)
        print(f"{scheme}: ready in {time.perf_counter() - t0:.1f} s", flush=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=48)
    answers = {scheme: _chat(llm, DEFAULT_PROMPTS, greedy)[0] for scheme, llm in llms.items()}
    best = {(scheme, batch): 0.0 for scheme in llms for batch in (1, args.batch)}
    before = {scheme: llm.llm_engine.runner.num_compilations for scheme, llm in llms.items()}
    for _ in range(args.rounds):
        for batch in (1, args.batch):
            for scheme, llm in llms.items():
                best[scheme, batch] = max(best[scheme, batch], _tok_s(llm, batch, args.max_tokens))
    base = args.schemes[0]
    rows = []
    print(f"\n{args.max_tokens} greedy tokens per request, best of {args.rounds} interleaved rounds; "
          f"ratios vs {base}")
    compiled = {scheme: llm.llm_engine.runner.num_compilations - before[scheme] for scheme, llm in llms.items()}
    tok = llms[base].get_tokenizer()
    chat_prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                       add_generation_prompt=True), add_special_tokens=False)
                    for p in DEFAULT_PROMPTS]
    total = sum(map(len, answers[base]))
    print(f"{'scheme':<6} {'param MB':>9} {'b1 tok/s':>9} {'ratio':>6} {'b1 MB/tok':>10} {f'b{args.batch} tok/s':>10} "
          f"{'ratio':>6} {f'b{args.batch} MB/tok':>11} {'greedy prefix':>14} {'teacher-forced':>15}")
    for scheme, llm in llms.items():
        param_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(llm.llm_engine.runner.params))
        prefix = _common_prefix(answers[scheme], answers[base])
        forced = _teacher_forced(llm, chat_prompts, answers[base])
        row = {"scheme": scheme, "param_bytes": param_bytes,
               "b1_tok_s": best[scheme, 1], "b1_ratio": best[scheme, 1] / best[base, 1],
               "batch": args.batch, "bN_tok_s": best[scheme, args.batch],
               "bN_ratio": best[scheme, args.batch] / best[base, args.batch],
               "b1_bytes_per_token": param_bytes, "bN_bytes_per_token": param_bytes / args.batch,
               "greedy_prefix": prefix, "teacher_forced_agree": forced, "answer_tokens": total,
               "compilations_while_timed": compiled[scheme]}
        rows.append(row)
        print(f"{scheme:<6} {param_bytes / 1e6:>9.1f} {row['b1_tok_s']:>9.1f} {row['b1_ratio']:>5.2f}x "
              f"{param_bytes / 1e6:>10.1f} {row['bN_tok_s']:>10.1f} {row['bN_ratio']:>5.2f}x "
              f"{param_bytes / args.batch / 1e6:>11.1f} {f'{prefix}/{total}':>14} {f'{forced}/{total}':>15}")
    for scheme in llms:
        if scheme != base:
            for prompt, mine, ref in zip(DEFAULT_PROMPTS, answers[scheme], answers[base]):
                if mine != ref:
                    print(f"\n[{scheme}] {prompt!r}\n  {base}: {tok.decode(ref)!r}\n  {scheme}: {tok.decode(mine)!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"max_tokens": args.max_tokens, "rounds": args.rounds, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()

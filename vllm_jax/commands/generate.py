"""`vllm-jax generate`: answer a few prompts with the offline LLM API (a quick look at a model without a
server), wrapped in the model's chat template when it has one."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from vllm_jax.config import MODEL_HELP, add_engine_args, engine_args_from_namespace

DEFAULT_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "What is 7 times 8?",
    "Name three primary colors.",
]


def run(ns: argparse.Namespace) -> int:
    from vllm_jax.llm import LLM
    from vllm_jax.sampling_params import SamplingParams

    args = engine_args_from_namespace(ns, ns.model)
    t0 = time.perf_counter()
    try:
        args.create_config()  # a bad flag or model is one line naming it, not a traceback
    except ValueError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    llm = LLM(**dataclasses.asdict(args))
    ready = time.perf_counter() - t0
    prompts = ns.prompt or DEFAULT_PROMPTS
    params = SamplingParams(temperature=ns.temperature, max_tokens=ns.max_tokens, seed=ns.seed)
    chat = ns.chat
    has_template = getattr(llm.get_tokenizer(), "chat_template", None) is not None
    if chat is None:  # not asked either way: chat when the model has a template
        chat = has_template
        if not chat:
            print("note: the tokenizer has no chat template; the prompts go to the model as plain text",
                  file=sys.stderr)
    elif chat and not has_template:
        print("ERROR: --chat needs a chat template and this model's tokenizer has none; pass --no-chat",
              file=sys.stderr)
        return 2
    t1 = time.perf_counter()
    if chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t1
    n_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    for prompt, out in zip(prompts, outputs):
        print(f"\n>>> {prompt}\n{out.outputs[0].text.strip()}  [{out.outputs[0].finish_reason}]")
    print(f"\n{len(prompts)} prompts, {n_tokens} tokens in {elapsed:.2f} s ({n_tokens / elapsed:.1f} tok/s); "
          f"engine ready in {ready:.1f} s (warm-up {llm.llm_engine.warmup_seconds:.1f} s)")
    return 0


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    gen = sub.add_parser("generate", help="generate from prompts with the offline LLM API",
                         description="Generate answers to a few prompts with the offline LLM API.",
                         formatter_class=formatter)
    gen.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    gen.add_argument("--prompt", action="append", help="a prompt (repeatable); default: a few examples")
    gen.add_argument("--max-tokens", type=int, default=48, help="most tokens to generate per prompt")
    gen.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="wrap each prompt in the model's chat template (default: when it has one)")
    add_engine_args(gen)
    gen.set_defaults(func=run)

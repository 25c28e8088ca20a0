"""`vllm-jax convert`: load a model once and save it as an orbax checkpoint that restores straight onto any
mesh (model_loader/convert.py)."""

from __future__ import annotations

import argparse

from vllm_jax.config import MODEL_HELP


def run(ns: argparse.Namespace) -> int:
    from vllm_jax.model_loader.convert import convert

    out, seconds = convert(ns.model, ns.out_dir, ns.dtype)
    print(f"converted in {seconds:.1f} s -> {out}; serve it with `vllm-jax serve {out}`")
    return 0


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    conv = sub.add_parser("convert", help="save a model's converted params with orbax for fast restarts",
                          description="Load MODEL once (dequantize, re-layout, cast) and save config, tokenizer and "
                          "params (orbax) to OUT_DIR; `vllm-jax serve OUT_DIR` then restores the params straight "
                          "onto any mesh.", formatter_class=formatter)
    conv.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    conv.add_argument("out_dir", help="output directory (must not exist or be empty)")
    conv.add_argument("--dtype", default="auto", help="params dtype: auto, float32, bfloat16, float16")
    conv.set_defaults(func=run)

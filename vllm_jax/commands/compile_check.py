"""`vllm-jax compile-check`: compile every warm-up program for TPU / GPU targets this host lacks (aot/report.py)."""

from __future__ import annotations

import argparse
import os

from vllm_jax.config import add_engine_args, engine_args_from_namespace


def run(ns: argparse.Namespace) -> int:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only targets need no accelerator on this host
    from vllm_jax.aot.report import run as run_report

    return run_report(ns.model, ns.target, engine_args_from_namespace(ns, None), ns.json, jobs=ns.jobs)


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    chk = sub.add_parser("compile-check", help="compile every warm-up program for TPU / GPU chips this host lacks",
                         description="Compile every program warm-up would compile (each forward bucket with its "
                         "KV write, each sampler variant) for compile-only TPU / GPU targets, from the model's "
                         "config.json alone (abstract weights, nothing allocated), and print per program the "
                         "compile time, the kernels found, XLA's memory and cost analysis and a roofline. Needs "
                         "jax[tpu] (libtpu) for TPU targets, jax-cuda12-plugin + jax-cuda12-pjrt for GPU ones. "
                         "Exits non-zero when any program fails to compile or a check fails.",
                         formatter_class=formatter)
    chk.add_argument("model", help="an HF config.json, or the directory holding it (no weights are read)")
    chk.add_argument("--target", action="append", required=True, metavar="TARGET",
                     help="v5e:1x1, v5e:2x2, v5e:2x4, v6e:1x1, v6e:2x2, v6e:2x4, h100, a100 or h200; "
                          "h100:8 etc. for several GPUs on one host (repeatable)")
    chk.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON ('-': stdout)")
    chk.add_argument("--jobs", type=int, default=1, help="targets checked at once, each in its own process")
    add_engine_args(chk)
    chk.set_defaults(func=run)

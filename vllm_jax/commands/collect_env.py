"""`vllm-jax collect-env`: what a bug report needs about this machine, as `vllm collect-env` prints it for vLLM.

The versions of Python and of the packages that decide how vllm_jax runs (jax, jaxlib, the TPU / CUDA plugins,
flax, transformers, ...), the devices jax sees, the CPU, and the environment variables that change behaviour
(JAX_*, XLA_*, VLLM_*, TPU_*, CUDA_*, HF_*), with any that look like a secret (a token, key or password) shown
as `<redacted>`. `--json` prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from importlib import metadata
from typing import Any

PACKAGES = ("vllm-jax", "jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "jax-cuda12-pjrt", "flax", "orbax-checkpoint",
            "transformers", "tokenizers", "torch", "numpy", "safetensors", "gguf", "xgrammar", "fastapi", "uvicorn",
            "openai")
ENV_PREFIXES = ("JAX_", "XLA_", "VLLM_", "TPU_", "LIBTPU_", "CUDA_", "NVIDIA_", "HF_", "TRANSFORMERS_",
                "OMP_NUM_THREADS")
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo, else what platform says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def jax_devices() -> dict[str, Any]:
    """The backend and devices jax sees (importing jax here: the command's slow part, a second or two)."""
    try:
        import jax

        devices = jax.devices()
        return {"backend": jax.default_backend(), "device_count": len(devices),
                "devices": [f"{d.platform}:{d.id} {getattr(d, 'device_kind', '')}".strip() for d in devices]}
    except Exception as exc:  # noqa: BLE001 - a broken install is what the report is for
        return {"backend": f"unavailable: {exc}", "device_count": 0, "devices": []}


def relevant_env() -> dict[str, str]:
    return {k: "<redacted>" if any(w in k for w in _SECRET_WORDS) else v for k, v in sorted(os.environ.items())
            if k.startswith(ENV_PREFIXES)}


def collect() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpu": cpu_model(),
            "cpu_count": os.cpu_count(), "packages": package_versions(), "jax": jax_devices(),
            "environment": relevant_env()}


def _print_report(report: dict[str, Any]) -> None:
    for key, value in report.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for name, item in value.items():
                print(f"  {name}: {', '.join(item) if isinstance(item, list) else item}")
        else:
            print(f"{key}: {value}")


def run(ns: argparse.Namespace) -> int:
    report = collect()
    if ns.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    return 0


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    parser = sub.add_parser("collect-env", help="print versions, devices and settings for a bug report",
                            description="Print the Python and package versions, the devices jax sees, the CPU and "
                            "the relevant environment variables (secrets redacted).", formatter_class=formatter)
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(func=run)

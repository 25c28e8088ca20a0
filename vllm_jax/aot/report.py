"""`vllm-jax compile-check`: every warm-up program compiled for each named target, printed and as JSON.

`run(model, targets, args)` resolves the model (a directory holding config.json, the file itself, or a GGUF file,
whose metadata gives the config and whose tensor types give `--quantization gguf`'s params: no weight is read),
checks each target with aot.engine_programs.check_target, prints one table per target (compile
seconds, kernels found, XLA's memory analysis, flops and bytes, roofline) and what failed, optionally writes
the whole result as JSON, and returns the exit code: 0 only when every target compiled every program and passed
aot.checks.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from typing import TextIO

from vllm_jax.aot.checks import expected_kernels, first_line
from vllm_jax.aot.engine_programs import check_target
from vllm_jax.aot.results import TargetResult
from vllm_jax.config import EngineArgs

GiB, MiB = 1 << 30, 1 << 20
_COLUMNS = ("program", "compile s", "kernels", "arg MiB", "out MiB", "alias MiB", "temp MiB", "GFLOP", "GB read",
            "roofline us")


def model_directory(path: str, scratch: str) -> str:
    """A directory with the model's config.json: `path` itself, its folder, or a copy of a differently named
    JSON file in `scratch`; a GGUF file is returned as it is (the engine reads its config from it)."""
    if os.path.isdir(path) or (os.path.isfile(path) and path.endswith(".gguf")):
        return path
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file or directory (give a config.json, the folder holding it, or a "
                         "GGUF file)")
    if os.path.basename(path) == "config.json":
        return os.path.dirname(os.path.abspath(path))
    shutil.copy(path, os.path.join(scratch, "config.json"))
    return scratch


def run(model: str, targets: list[str], args: EngineArgs, json_path: str | None = None,
        out: TextIO | None = None, jobs: int = 1) -> int:
    """Check every target (see the module docstring), `jobs` targets at a time in their own processes (XLA
    compiles a program on one core); -> the exit code."""
    out = out or sys.stdout
    with tempfile.TemporaryDirectory() as scratch:
        args = dataclasses.replace(args, model=model_directory(model, scratch))
        if jobs > 1 and len(targets) > 1:
            os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only: no chip to share
            context = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
                futures = [pool.submit(_check_one, args, name) for name in targets]
                for done in concurrent.futures.as_completed(futures):
                    print(format_target(done.result()), file=out, flush=True)
                results = [f.result() for f in futures]
        else:
            results = []
            for name in targets:
                results.append(_check_one(args, name))
                print(format_target(results[-1]), file=out, flush=True)
    if json_path:
        text = json.dumps([to_json(r) for r in results], indent=1)
        if json_path == "-":
            print(text, file=out)
        else:
            with open(json_path, "w") as f:
                f.write(text + "\n")
    return 0 if results and all(r.ok for r in results) else 1


def _check_one(args: EngineArgs, name: str) -> TargetResult:
    start = time.perf_counter()
    try:
        result = check_target(args, name)
    except (ValueError, RuntimeError) as exc:  # an unknown target, a missing plugin, a bad flag
        result = TargetResult(name, refused=str(exc))
    result.seconds = time.perf_counter() - start
    return result


def format_target(result: TargetResult) -> str:
    if not result.platform:  # refused before a config was built (an unknown target, a missing plugin)
        return f"== {result.target}\nREFUSED: {result.refused}"
    kv = f" (KV cache {result.kv_cache_dtype})" if result.kv_cache_dtype not in ("", result.dtype) else ""
    lines = [f"== {result.target}: {result.platform}, tp {result.tensor_parallel_size}, {result.attention_backend}, "
             f"{result.dtype}{kv}, max_model_len {result.max_model_len}, max_num_seqs {result.max_num_seqs}, "
             f"max_num_batched_tokens {result.max_num_batched_tokens}, block_size {result.block_size}"]
    if result.refused:
        return "\n".join(lines + [f"REFUSED: {result.refused}"])
    if (b := result.budget) is not None:
        lines.append(f"memory per device: {b.device_bytes / GiB:.1f} GiB, {b.usable_bytes / GiB:.2f} usable: "
                     f"weights {b.weight_bytes / GiB:.2f} GiB, KV cache {b.kv_bytes / GiB:.2f} GiB "
                     f"({b.num_blocks} blocks), largest temporaries {b.temp_bytes / GiB:.3f} GiB")
    rows = [_COLUMNS] + [_row(p) for p in result.programs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines += ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
              for row in rows]
    lines.append(f"{len(result.programs)} programs, {result.compile_seconds:.0f} s compiling, "
                 f"{result.compile_cpu_seconds:.0f} s of CPU (the KV probe's compiles included; {result.seconds:.0f} s "
                 "in all)")
    if result.programs and result.programs[0].report.ok and _layer_loop(result):
        lines.append("note: XLA's cost analysis counts the layer loop's body once, so GFLOP / GB / roofline cover "
                     "one layer plus the rest; --no-scan-layers compiles the layers unrolled for whole-step figures")
    kernels = "" if not expected_kernels(result) else (
        ", the MLA kernel in every forward" if result.mla else ", its kernels in every forward")
    lines += [f"FAILED: {f}" for f in result.failures] or ["ok: every program compiled" + kernels
                                                            + ", the KV cache aliased in place"]
    return "\n".join(lines)


def _row(program) -> tuple[str, ...]:
    r = program.report
    if not r.ok:
        return (program.label, f"{r.compile_seconds:.1f}", "-", "FAILED: " + first_line(r.error)[:100],
                *([""] * 6))
    m = r.memory
    return (program.label, f"{r.compile_seconds:.1f}" + ("*" if program.reused else ""),
            str(len(set(r.kernel_names))), *(f"{m.get(k, 0) / MiB:.1f}" for k in (
                "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes")),
            f"{r.flops / 1e9:.1f}", f"{r.bytes_accessed / 1e9:.2f}", f"{r.roofline_seconds * 1e6:.0f}")


def _layer_loop(result: TargetResult) -> bool:
    return result.scan_layers and result.num_layers > 1


def to_json(result: TargetResult) -> dict:
    data = dataclasses.asdict(result)
    data["ok"] = result.ok
    if result.budget is not None:
        data["budget"]["kv_bytes"] = result.budget.kv_bytes
    for program, entry in zip(result.programs, data["programs"]):
        entry["decode"] = program.decode
        entry["report"]["kernel_present"] = program.report.kernel_present
    return data

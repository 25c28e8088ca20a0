"""Every warm-up program of real models at the engine's defaults, compiled for TPU and GPU chips this host lacks.

    python benchmarks/aot_models.py [--only MODEL|MODEL@TARGET ...] [--jobs 2] [--json F]

Needs libtpu / the CUDA plugin (as `vllm-jax compile-check`, whose check each cell is: vllm_jax.aot.engine_programs
.check_target with the full bucket set, both kernels in every forward, the KV cache aliased in place, the KV budget
from the compiled programs' temporaries). Weights are abstract bfloat16 (the configs' own dtype; one float32 cell),
from the public config.json files in vllm_jax/aot/model_configs.py, with every layer. A chip the weights do not
fit gets its refusal (the message naming the flag), as the engine's start-up would print it; the model is then
also checked on the smallest slice that holds it. Prints one row per cell and a markdown table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

# (model, target, tensor parallel size, expert parallel, dtype)
CELLS = [
    ("llama-3.1-8b", "v5e:1x1", 1, False, None), ("llama-3.1-8b", "v5e:2x2", 4, False, None),
    ("llama-3.1-8b", "v6e:1x1", 1, False, None), ("llama-3.1-8b", "v6e:2x2", 4, False, None),
    ("llama-3.1-8b", "h100", 1, False, None),
    ("llama-3.1-8b", "a100", 1, False, None),
    ("qwen3-8b", "v5e:2x2", 4, False, None), ("qwen3-8b", "v6e:1x1", 1, False, None),
    ("qwen3-8b", "h100", 1, False, None), ("qwen3-8b", "a100", 1, False, None),
    ("qwen3-8b", "h100", 1, False, "float32"),
    ("qwen3-30b-a3b", "v5e:2x4", 8, True, None), ("qwen3-30b-a3b", "v6e:2x2", 4, True, None),
    ("qwen3-30b-a3b", "h100:2", 2, True, None), ("qwen3-30b-a3b", "a100:2", 2, True, None),
    ("mixtral-8x7b", "v5e:2x4", 8, False, None), ("mixtral-8x7b", "v6e:2x4", 8, False, None),
    ("mixtral-8x7b", "h100:8", 8, False, None), ("mixtral-8x7b", "a100:8", 8, False, None),
]


def check_cell(model_dir: str, model: str, target: str, tp: int, ep: bool, dtype: str | None) -> dict:
    from vllm_jax import EngineArgs
    from vllm_jax.aot.checks import first_line
    from vllm_jax.aot.engine_programs import check_target

    start = time.perf_counter()
    args = EngineArgs(model=os.path.join(model_dir, model), tensor_parallel_size=tp, enable_expert_parallel=ep,
                      **({"dtype": dtype} if dtype else {}))
    try:
        r = check_target(args, target)
    except (ValueError, RuntimeError) as exc:
        return dict(model=model, target=target, tp=tp, ep=ep, ok=False, refused=first_line(str(exc)))
    row = dict(model=model, target=target, tp=tp, ep=ep, dtype=r.dtype, ok=r.ok, refused=r.refused,
               failures=r.failures, max_model_len=r.max_model_len, max_num_seqs=r.max_num_seqs,
               backend=r.attention_backend, block_size=r.block_size, programs=len(r.programs),
               compile_seconds=sum(p.report.compile_seconds for p in r.programs if not p.reused),
               seconds=time.perf_counter() - start)
    if r.budget is not None:
        b = r.budget
        row |= dict(weights_gib=b.weight_bytes / 2**30, kv_gib=b.kv_bytes / 2**30, num_blocks=b.num_blocks,
                    temp_gib=max((p.report.memory.get("temp_size_in_bytes", 0) for p in r.programs), default=0)
                    / 2**30, kv_tokens=(b.num_blocks - 1) * r.block_size)
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| model | chip | tp / ep | dtype | max_model_len | result | programs | KV cache per chip | "
             "largest temporaries |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        par = f"tp {r['tp']}" + (" ep" if r["ep"] else "")
        if r.get("refused") and not r.get("programs"):
            lines.append(f"| {r['model']} | {r['target']} | {par} | {r.get('dtype', '')} | "
                         f"{r.get('max_model_len', '')} | refused: {r['refused'][:150]} | | | |")
            continue
        verdict = "ok" if r["ok"] else "FAILED: " + "; ".join(r["failures"])[:150]
        lines.append(f"| {r['model']} | {r['target']} | {par} | {r['dtype']} | {r['max_model_len']} | {verdict} | "
                     f"{r['programs']} | {r.get('kv_gib', 0):.1f} GiB ({r.get('kv_tokens', 0):,} tokens) | "
                     f"{1024 * r.get('temp_gib', 0):.0f} MiB |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", default=None,
                        help="models (qwen3-8b) or cells (qwen3-8b@h100) to check (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="cells compiled at once, each in its own process")
    parser.add_argument("--json", default=None)
    ns = parser.parse_args()
    from vllm_jax.aot.model_configs import MODELS, write_config

    cells = [c for c in CELLS if ns.only is None or c[0] in ns.only or f"{c[0]}@{c[1]}" in ns.only]
    with tempfile.TemporaryDirectory() as model_dir:
        for name, config in MODELS.items():
            write_config(os.path.join(model_dir, name), config)
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(ns.jobs, mp_context=context) as pool:
            futures = [pool.submit(check_cell, model_dir, *cell) for cell in cells]
            for done in concurrent.futures.as_completed(futures):
                print(json.dumps(done.result()), flush=True)
            rows = [f.result() for f in futures]
    print(markdown(rows))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""Roofline of the engine's decode step for Llama-3-8B on chips this host does not have, from compiled programs.

    python benchmarks/aot_roofline.py [--targets v5e:2x4 v6e:1x1 h100] [--batches 1 64 256]
                                      [--contexts 1024 8192] [--quantization none int8 fp8] [--json F]

Needs libtpu / the CUDA plugin (as `vllm-jax compile-check`). For each target, batch B and context C, the
engine's forward for the B-token, B-sequence bucket is compiled (vllm_jax.aot.engine_programs.compile_plan)
with abstract bfloat16 weights of Llama-3.1-8B's 32 layers, max_model_len C and a KV cache of B x C tokens, so
each kernel's CostEstimate (the bucket at full occupancy) is exactly B sequences of C tokens. The layers are
unrolled (--no-scan-layers) because XLA's cost analysis counts a loop body once. A multi-chip target runs
tensor parallelism over all its chips; every figure is per chip.

- must read: every weight once, the embedding table excepted (B rows are gathered), plus B x C tokens of KV;
- program: the compiled program's bytes (XLA:TPU's cost analysis, which counts the Mosaic kernels' estimates; on
  GPU XLA's HloCostAnalysis over the optimized module plus the Triton kernels' estimates, aot/hlo_cost.py);
- ratio: program / must read (above ~1.2 means a copy or a poor fusion); the host's CPU target is compiled without
  the native CPU kernels (vllm_jax/native/), whose calls XLA's cost analysis does not see into;
- TPU, no VMEM prefetch: the same program compiled with XLA:TPU's memory-space assignment into VMEM off. XLA's
  cost analysis counts the prefetch copies into VMEM (slice-start / copy-start, the ConcatBitcast reassembling
  them) on top of the fusions that then read the VMEM copy, so on TPU the program's figure is not HBM traffic;
  without the prefetch every byte counted is an HBM access, and that figure is the roofline's;
- roofline: max(HBM bytes / HBM bandwidth, flops / peak bf16) per step, and B / that in tok/s.
With --quantization int8 / fp8 the layers' linear weights are the engine's quantized params (values plus per
channel scales, docs/architecture/06-model.md "Quantized weights"), so "must read" counts their bytes, not bfloat16's.
A cell whose weights and KV exceed --gpu-memory-utilization of the chip is not compiled (XLA:TPU refuses such a
program): it shows the memory it would need.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
# The host's CPU target compiles the XLA dots: XLA's cost analysis cannot see inside the native kernels' calls.
os.environ.setdefault("VLLM_JAX_NATIVE_KERNELS", "0")

from vllm_jax import EngineArgs
from vllm_jax.aot.engine_programs import compile_plan
from vllm_jax.aot.model_configs import write_config
from vllm_jax.aot.targets import get_target
from vllm_jax.utils import cdiv
from vllm_jax.worker.engine_builder import build_engine, shard_bytes

BLOCK_SIZE = 16
# libtpu's switches of memory-space assignment into VMEM (both generations' names; each chip reads its own).
NO_VMEM_PREFETCH = {"xla_vf_vmem_memory_space_assignment": False, "xla_gf_vmem_memory_space_assignment": False}


def cell(model_dir: str, target_name: str, batch: int, context: int, quantization: str | None = None) -> dict:
    target = get_target(target_name)
    tp = len(target.devices)
    blocks = batch * cdiv(context, BLOCK_SIZE) + 1  # + the null block
    args = EngineArgs(model=model_dir, max_model_len=context, max_num_seqs=batch,
                      max_num_batched_tokens=max(batch, 16), min_token_bucket=batch, min_seq_bucket=batch,
                      num_gpu_blocks_override=blocks, scan_layers=False, tensor_parallel_size=tp,
                      block_size=BLOCK_SIZE, quantization=quantization)
    config = args.create_config(platform=target.platform)
    engine = build_engine(config, target.devices, abstract=True)
    embed = shard_bytes(engine.params["embed_tokens"].get_value())
    kv_touched = batch * context * engine.kv_bytes_per_block // BLOCK_SIZE
    need = engine.weight_bytes - embed + batch * embed // engine.spec.vocab_size + kv_touched
    row = dict(target=target_name, chips=tp, weights=quantization or config.model_config.dtype, batch=batch,
               context=context, must_read_bytes=need,
               memory_bytes=engine.weight_bytes + blocks * engine.kv_bytes_per_block,
               usable_bytes=int(0.9 * target.engine_memory_bytes))
    if row["memory_bytes"] > row["usable_bytes"]:
        return row | dict(fits=False)
    [program] = compile_plan(engine, target, blocks, [(batch, batch)], kinds=("forward",))
    r = program.report
    if not r.ok:
        return row | dict(fits=True, error=r.error)
    row |= dict(fits=True, program_bytes=r.bytes_accessed, flops=r.flops, ratio=r.bytes_accessed / need,
                must_read_s=need / target.spec.hbm_bytes_per_s, temp_bytes=r.memory["temp_size_in_bytes"],
                compile_seconds=r.compile_seconds, kernels=sorted(set(r.kernel_names)))
    hbm_bytes = r.bytes_accessed
    if target.platform == "tpu":
        [plain] = compile_plan(engine, target, blocks, [(batch, batch)], kinds=("forward",),
                               compiler_options=NO_VMEM_PREFETCH)
        if not plain.report.ok:
            return row | dict(error=plain.report.error)
        hbm_bytes = plain.report.bytes_accessed
        row |= dict(no_vmem_prefetch_bytes=hbm_bytes, no_vmem_prefetch_ratio=hbm_bytes / need)
    roofline = max(hbm_bytes / target.spec.hbm_bytes_per_s, r.flops / target.spec.peak_bf16_flops)
    return row | dict(hbm_bytes=hbm_bytes, roofline_s=roofline, tok_s=batch / roofline)


def markdown(rows: list[dict]) -> str:
    lines = ["| chip | weights | batch | context | must read GB | program GB | ratio | "
             "TPU, no VMEM prefetch: GB, ratio | roofline ms | tok/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        chip = r["target"] + (f" (tp {r['chips']})" if r["chips"] > 1 else "")
        head = (f"| {chip} | {r['weights']} | {r['batch']} | {r['context'] // 1024}k | "
                f"{r['must_read_bytes'] / 1e9:.2f} |")
        if not r["fits"]:
            lines.append(f"{head} does not fit: {r['memory_bytes'] / 1e9:.0f} GB per chip of "
                         f"{r['usable_bytes'] / 1e9:.0f} | | | | |")
        elif "error" in r:
            lines.append(f"{head} FAILED: {r['error'].splitlines()[0][:80]} | | | | |")
        else:
            plain = (f"{r['no_vmem_prefetch_bytes'] / 1e9:.2f}, {r['no_vmem_prefetch_ratio']:.2f}"
                     if "no_vmem_prefetch_bytes" in r else "")
            lines.append(f"{head} {r['program_bytes'] / 1e9:.2f} | {r['ratio']:.2f} | {plain} | "
                         f"{1000 * r['roofline_s']:.2f} | {r['tok_s']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", nargs="+", default=["v5e:2x4", "v6e:1x1", "h100"])
    parser.add_argument("--layers", type=int, default=None, help="fewer layers (a quick check of the script)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--quantization", nargs="+", default=["none"], choices=["none", "int8", "fp8"],
                        help="weight schemes to compare (none: the dtype, bfloat16 on TPU / GPU)")
    parser.add_argument("--json", default=None)
    ns = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as model_dir:
        write_config(model_dir, **({"num_hidden_layers": ns.layers} if ns.layers else {}))
        for target in ns.targets:
            for batch in ns.batches:
                for context in ns.contexts:
                    for scheme in ns.quantization:
                        rows.append(cell(model_dir, target, batch, context, None if scheme == "none" else scheme))
                        print(json.dumps({k: v for k, v in rows[-1].items() if k != "kernels"}), flush=True)
    print(markdown(rows))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

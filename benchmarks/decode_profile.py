"""Where a decode step's time goes on CPU (batch 1 by default): the engine's end-to-end tok/s, the forward program
and the sampler timed alone, and a `jax.profiler` trace of the forward split into the layers' GEMVs (with the GB/s
each streams its weight at), the LM head, attention and the rest (XLA:CPU's thunk dispatch, norms, rotary).

    python benchmarks/decode_profile.py [--model M] [--quantization gguf] [--context 128] [--steps 20] [--batch 1]

--batch N profiles N sequences decoding together (the 32-sequence row of benchmarks/vs_llamacpp.py: --batch 32);
the "GEMVs" are then the layers' [N, in] x [in, out] dots.

The trace's events are XLA:CPU's thunks (one per fusion, conditional and loop, nested); each event's self time
(its duration less its children's) is charged to a category read from the optimized HLO: a dot fusion is a GEMV
when its weight operand is a layer matrix, the LM head when it is the [vocab, hidden] table. "dispatch" is the
time of the conditionals / loops themselves (the per-layer switch picking its branch) and the gap between thunks.
Figures move with the machine's load: compare runs made together.
"""

from __future__ import annotations

import argparse
import collections
import glob
import re
import tempfile
import time

import jax
import numpy as np
from step_timing import decode_inputs

from vllm_jax import LLM, EngineArgs, SamplingParams
from vllm_jax.model.embedding_head import HEAD_CHUNK_ROWS
from vllm_jax.sample.metadata import build_sampling_tensors
from vllm_jax.worker.model_runner import ModelRunner

_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")
_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s8": 1, "u8": 1, "s32": 4, "pred": 1, "f8e4m3fn": 1}


def best_ms(fn, repeats: int) -> tuple[float, float]:
    """(median, min) milliseconds of `fn` after one warm call; the min is the figure least hurt by contention."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times)), 1000 * float(np.min(times))


def hlo_instructions(hlo: str) -> dict[str, tuple[str, list[tuple[str, tuple[int, ...]]], tuple[int, ...]]]:
    """instruction name -> (its jax op_name, its fused computation's parameter (dtype, shape) list ([] if not a
    fusion), its output shape)."""
    params = {}
    for m in re.finditer(r"^%(\S+) \((.*?)\) -> ", hlo, re.M):
        params[m.group(1)] = [(d, tuple(int(s) for s in dims.split(",") if s))
                              for d, dims in _SHAPE.findall(m.group(2))]
    out = {}
    for m in re.finditer(r"^\s+(?:ROOT )?%(\S+) = ([^\n]*)", hlo, re.M):
        line = m.group(2)
        calls = re.search(r"calls=%([\w.\-]+)", line) if " fusion(" in line else None
        op_name = re.search(r'op_name="([^"]*)"', line)
        shape = _SHAPE.match(line)
        operands = params.get(calls.group(1), []) if calls else []
        name = op_name.group(1) if op_name else ""
        if " custom-call(" in line:  # a native kernel (vllm_jax/native/): its target and operand shapes
            target = re.search(r'custom_call_target="([^"]*)"', line)
            name += f" target={target.group(1) if target else ''}"
            args = re.search(r"operand_layout_constraints=\{((?:[^{}]|\{[^{}]*\})*)\}", line)
            operands = [(d, tuple(int(s) for s in dims.split(",") if s))
                        for d, dims in _SHAPE.findall(args.group(1) if args else "")]
        out[m.group(1)] = (name, operands,
                           tuple(int(s) for s in shape.group(2).split(",") if s) if shape else ())
    return out


def _nbytes(operand: tuple[str, tuple[int, ...]]) -> int:
    dtype, shape = operand
    return int(np.prod(shape or (1,))) * _BYTES.get(dtype, 4)


def classify(name: str, instructions: dict, head_dims: tuple[int, ...]) -> tuple[str, int]:
    """(category, weight bytes read) of one thunk event: a dot (or a native kernel's, on kept GGUF blocks) inside
    the per-layer switch is a layer GEMV (its weight: every operand but the activations, the first); the LM head is
    what outside the switch and outside attention's einsums outputs a vocab-sized or vocab-chunk dim (`head_dims`:
    its dots, its chunk loop's slices and dequantization); a fusion reading int8 / uint8 inside the switch
    dequantizes a kept weight; the conditionals and loops themselves are dispatch; the rest of the layer loop is
    attention (page gathers, KV writes, softmax, rotary, norms)."""
    op_name, operands, shape = instructions.get(name, ("", [], ()))
    if name.startswith(("cond", "conditional", "while")):
        return "dispatch", 0
    if "target=vllm_jax_gguf_rows_dot" in op_name or "target=vllm_jax_float_rows_dot" in op_name:  # a tied head's
        return "lm_head", sum(_nbytes(o) for o in operands[1:])
    is_dot = "dot_general" in op_name or "ynn" in name or any(f"target=vllm_jax_{kernel}" in op_name
                                                            for kernel in ("gguf_matvec", "float_matvec"))
    in_switch = "/cond/branch" in op_name
    if is_dot and in_switch:
        return "layer_gemv", sum(_nbytes(o) for o in operands[1:])
    if not in_switch and "->" not in op_name and any(d in head_dims for d in shape):
        return "lm_head", sum(_nbytes(o) for o in operands[1:]) if is_dot else 0
    if in_switch and any(d in ("u8", "s8") for d, _ in operands):
        return "dequantize", 0
    if "/while/body/" in op_name:
        return "attention+norms", 0
    return "other", 0


def profile_forward(runner: ModelRunner, inputs, steps: int, hlo: str) -> dict:
    instructions = hlo_instructions(hlo)
    head_dims = (runner.spec.vocab_size, HEAD_CHUNK_ROWS["cpu"])
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.block_until_ready(runner.step(inputs))
        jax.profiler.start_trace(trace_dir)
        t0 = time.perf_counter()
        for _ in range(steps):
            jax.block_until_ready(runner.step(inputs))
        wall = (time.perf_counter() - t0) / steps
        jax.profiler.stop_trace()
        data = jax.profiler.ProfileData.from_file(glob.glob(f"{trace_dir}/plugins/profile/*/*.xplane.pb")[0])
    totals: dict[str, float] = collections.defaultdict(float)
    gemv_rates: dict[tuple, list[float]] = collections.defaultdict(list)
    names: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    busy = 0.0
    for line in data.find_plane_with_name("/host:CPU").lines:
        if not line.name.startswith("tf_XLA"):
            continue
        stack: list[list] = []  # [end_ns, name, child_ns, start_ns]
        events = sorted(((e.start_ns, e.duration_ns, e.name) for e in line.events), key=lambda e: (e[0], -e[1]))

        def close(entry: list) -> None:
            end, name, child, start = entry
            if name.startswith("ThunkExecutor::Execute"):
                return
            self_ns = (end - start) - child
            category, nbytes = classify(name, instructions, head_dims)
            totals[category] += self_ns
            names[category][name.split(".")[0]] += self_ns
            if category == "layer_gemv" and self_ns > 0:
                gemv_rates[tuple(o[1] for o in instructions[name][1])].append(nbytes / self_ns)

        for start, duration, name in events:
            while stack and stack[-1][0] <= start:
                done = stack.pop()
                close(done)
                if stack:
                    stack[-1][2] += done[0] - done[3]
            if name == "ThunkExecutor::Execute" and not stack:
                busy += duration
            stack.append([start + duration, name, 0.0, start])
        while stack:
            done = stack.pop()
            close(done)
            if stack:
                stack[-1][2] += done[0] - done[3]
    ms = {k: v / 1e6 / steps for k, v in totals.items()}
    ms["dispatch"] = ms.get("dispatch", 0.0) + max(0.0, busy / 1e6 / steps - sum(ms.values()))
    rates = {shape: float(np.median(r)) for shape, r in gemv_rates.items()}
    top = {k: [(n, v / 1e6 / steps) for n, v in c.most_common(3)] for k, c in names.items()}
    return {"wall_ms": 1000 * wall, "ms": ms, "gemv_gbs": rates, "top": top}


def sampler_ms(runner: ModelRunner, repeats: int) -> tuple[float, float]:
    rows = runner.seq_bucket(runner.token_buckets[0])
    tensors, _ = build_sampling_tensors([], rows, runner.vocab_size)
    logits = jax.numpy.zeros((rows, runner.vocab_size), jax.numpy.float32)
    return best_ms(lambda: runner.device.sample(logits, tensors, -1).token_ids, repeats)


def engine_tok_s(args: EngineArgs, prompt_len: int, output_len: int) -> float:
    llm = LLM(**{k: v for k, v in vars(args).items() if k in ("model", "quantization", "max_model_len")})
    rng = np.random.default_rng(0)
    prompt = {"prompt_token_ids": rng.integers(100, 10000, prompt_len).tolist()}
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), use_tqdm=False)
    t0 = time.perf_counter()
    out = llm.generate([prompt], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    return len(out[0].outputs[0].token_ids) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=1, help="sequences decoding in the profiled step")
    parser.add_argument("--skip-engine", action="store_true", help="only the forward and sampler timings")
    ns = parser.parse_args()
    args = EngineArgs(model=ns.model, quantization=ns.quantization, max_model_len=1024)
    blocks = ns.batch * -(-(ns.context + 1) // 16) + 2  # every sequence's pages (block size 16) and the null block
    runner = ModelRunner(EngineArgs(model=ns.model, quantization=ns.quantization, max_model_len=1024,
                                    max_num_seqs=max(ns.batch, 4), block_size=16,
                                    num_gpu_blocks_override=max(256, blocks)).create_config())
    inputs = decode_inputs(runner, ns.batch, ns.context)
    device = runner.device
    hlo = device._forward.lower(device.params, device.kv_cache, inputs).compile().as_text()
    fwd_med, fwd_min = best_ms(lambda: runner.step(inputs), ns.steps)
    smp_med, smp_min = sampler_ms(runner, ns.steps)
    prof = profile_forward(runner, inputs, ns.steps, hlo)
    print(f"forward (batch {ns.batch}, {ns.context} context, bucket {inputs.input_ids.shape[0]} tokens): median "
          f"{fwd_med:.1f} ms, min {fwd_min:.1f} ms")
    print(f"sampler (greedy, basic variant): median {smp_med:.2f} ms, min {smp_min:.2f} ms")
    print(f"traced forward: {prof['wall_ms']:.1f} ms a step; self time by category (ms a step):")
    for category, value in sorted(prof["ms"].items(), key=lambda kv: -kv[1]):
        top = ", ".join(f"{n} {v:.2f}" for n, v in prof["top"].get(category, []))
        print(f"  {category:16s} {value:7.2f}   ({top})")
    print("layer GEMVs, median GB/s each streams its operands at (shapes of the fused dot's operands):")
    for shape, gbs in sorted(prof["gemv_gbs"].items()):
        print(f"  {shape}: {gbs:.1f} GB/s")
    if not ns.skip_engine:
        del runner
        print(f"engine: batch-1 decode, 128-token prompt, 128 greedy tokens: {engine_tok_s(args, 128, 128):.1f} tok/s")


if __name__ == "__main__":
    main()

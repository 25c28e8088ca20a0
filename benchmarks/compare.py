"""Side by side with transformers on the same weights, in one run, with the hardware floors measured alongside.

    python benchmarks/compare.py [--workloads A,B,C,D] [--skip-transformers] [--output-json F]
    python benchmarks/compare.py --quantization none gguf int8 [--workloads A,C] [--rounds 2]
    python benchmarks/compare.py --device-mode [--device-shape llama3-8b|tiny] [--batches 1 8 ...] [--context N]

Workloads (the default model, float32, greedy, EOS ignored, fixed seed):
  A offline        32 prompts of 64-256 random tokens, 64 output tokens each
  B mixed lengths  64 prompts of 32-512 tokens, max_tokens drawn from 8-256 per request
  C batch-1        one 128-token prompt, 128 output tokens
  D shared prefix  a ~1k-token system prompt + 64 short questions, prefix caching on vs off (this engine only)
transformers runs `generate` at batch 32 with left padding and a static cache (its best configuration here); a
static batch runs to its longest request, and only the tokens each request asked for are counted.
Floors, measured in the same run: float32 matmul GFLOP/s at the model's MLP shape, and memory bandwidth (GB/s,
a large reduction). A/B floor: 2 x params x tokens / GFLOP/s. C floor: (weights + KV read) bytes per token /
bandwidth. Each workload is reported as output tok/s and as a share of its floor (floor time / actual time); D's
floor counts the shared prompt once, as prefix caching computes it.
EasyDeL's eSurge is the JAX peer; this harness does not drive it (it is not installable offline here) and says so.
--device-mode runs device_decode.py instead: an accelerator's decode throughput on a Llama-3-8B-shaped model.
--quantization runs the chosen workloads (A and C by default) once per scheme instead, in interleaved rounds
(best round kept), and reports tok/s against the first scheme's, the params' device bytes, and the weight bytes
read per output token (params / the step's batch: 32 requests for A, 1 for C).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time

import numpy as np
from device_decode import measure_bandwidth_gbs, run_device_mode
from engine_share import device_share

SEED = 0


def workloads(vocab: int) -> dict[str, list[tuple[list[int], int]]]:
    rng = np.random.default_rng(SEED)
    ids = lambda n: rng.integers(100, vocab, int(n)).tolist()  # noqa: E731 - skip special ids
    system = ids(1000)
    return {
        "A": [(ids(rng.integers(64, 257)), 64) for _ in range(32)],
        "B": [(ids(rng.integers(32, 513)), int(rng.integers(8, 257))) for _ in range(64)],
        "C": [(ids(128), 128)],
        "D": [(system + ids(rng.integers(8, 33)), 32) for _ in range(64)],
    }


def measure_floors(hidden: int, intermediate: int) -> dict[str, float]:
    """f32 matmul GFLOP/s at the model's MLP shape, and read bandwidth over 256 MiB (far beyond any cache)."""
    import jax
    import jax.numpy as jnp

    a, b = jnp.ones((512, hidden), jnp.float32), jnp.ones((hidden, intermediate), jnp.float32)
    matmul = jax.jit(lambda a, b: a @ b)
    jax.block_until_ready(matmul(a, b))
    t0 = time.perf_counter()
    for _ in range(20):
        jax.block_until_ready(matmul(a, b))
    gflops = 20 * 2 * 512 * hidden * intermediate / (time.perf_counter() - t0) / 1e9
    return {"matmul_gflops": gflops, "bandwidth_gbs": measure_bandwidth_gbs(256 << 20, repeats=5)}


def run_engine(requests, llm=None, **engine_args) -> tuple[float, int, float]:
    """(seconds, output tokens, warm-up seconds) through LLM.generate (on `llm`, or a new engine)."""
    from vllm_jax import LLM, SamplingParams

    llm = llm or LLM(**engine_args)
    prompts = [{"prompt_token_ids": p} for p, _ in requests]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in requests]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    return seconds, sum(len(o.outputs[0].token_ids) for o in outs), llm.llm_engine.warmup_seconds


def run_quantization(chosen: list[str], schemes: list[str], rounds: int) -> dict:
    """Each workload under each --quantization scheme, one engine per scheme alive throughout, rounds interleaved."""
    import jax

    from vllm_jax import LLM

    loads = workloads(_default_vocab())
    engines = {s: LLM(max_model_len=2048, quantization=None if s == "none" else s, **device_share(len(schemes)))
               for s in schemes}
    param_bytes = {s: sum(x.nbytes for x in jax.tree.leaves(llm.llm_engine.runner.params))
                   for s, llm in engines.items()}
    results = {}
    for name in chosen:
        requests, batch = loads[name], len(loads[name])
        best = {s: 0.0 for s in schemes}
        for _ in range(rounds):
            for s, llm in engines.items():
                seconds, out, _ = run_engine(requests, llm)
                best[s] = max(best[s], out / seconds)
        base = best[schemes[0]]
        results[name] = {s: {"tok_s": best[s], "vs_first": best[s] / base, "param_mb": param_bytes[s] / 1e6,
                             "mb_per_token": param_bytes[s] / 1e6 / batch} for s in schemes}
        print(name, json.dumps(results[name]), flush=True)
    print("\n| workload | scheme | tok/s | vs " + schemes[0] + " | param MB | weight MB read per token |")
    print("|---|---|---|---|---|---|")
    for name, entry in results.items():
        for s, e in entry.items():
            print(f"| {name} | {s} | {e['tok_s']:.1f} | {e['vs_first']:.2f}x | {e['param_mb']:.1f} | "
                  f"{e['mb_per_token']:.1f} |")
    return results


def _default_vocab() -> int:
    from vllm_jax import EngineArgs

    return EngineArgs().create_config().model_config.hf_config.vocab_size


def load_transformers():
    """transformers' LlamaForCausalLM with the default model's weights, dequantized by our GGUF reader (the same
    float32 tensors this engine loads)."""
    import torch
    from transformers import AutoModelForCausalLM

    from vllm_jax.model_loader.gguf_file import iter_gguf_tensors, read_gguf_config
    from vllm_jax.model_loader.source import default_model_path

    torch.set_num_threads(os.cpu_count() or 1)
    path = default_model_path()
    model = AutoModelForCausalLM.from_config(read_gguf_config(path), dtype=torch.float32)
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in iter_gguf_tensors(path)},
                                                strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.eval()


def run_transformers(model, requests, batch_size: int = 32) -> tuple[float, int, float]:
    """(seconds, output tokens counted as requested, first-batch overhead seconds): static batches, left
    padding, static cache; each batch runs to its longest max_tokens."""
    import torch

    pad = 0
    seconds, produced, first = 0.0, 0, None
    for start in range(0, len(requests), batch_size):
        batch = requests[start:start + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        steps = max(n for _, n in batch)
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps,
                           do_sample=False, pad_token_id=pad, cache_implementation="static")
        elapsed = time.perf_counter() - t0
        first = elapsed if first is None else first
        seconds += elapsed
        produced += sum(n for _, n in batch)
    return seconds, produced, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="A,B,C,D")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--device-mode", action="store_true")
    parser.add_argument("--device-shape", default="llama3-8b", choices=["llama3-8b", "tiny"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    parser.add_argument("--context", type=int, default=1024, help="device mode: tokens of KV per sequence")
    parser.add_argument("--repeats", type=int, default=5, help="device mode: timed steps per batch")
    parser.add_argument("--quantization", nargs="+", default=None,
                        help="schemes to compare (none = float32 from the dequantized GGUF; gguf, int8, fp8)")
    parser.add_argument("--rounds", type=int, default=2, help="--quantization: interleaved rounds per workload")
    ns = parser.parse_args()
    if ns.quantization:
        chosen = ns.workloads.split(",") if ns.workloads != "A,B,C,D" else ["A", "C"]
        results = run_quantization(chosen, ns.quantization, ns.rounds)
        if ns.output_json:
            with open(ns.output_json, "w") as f:
                json.dump(results, f, indent=2)
        return
    if ns.device_mode:
        results = run_device_mode(ns.device_shape, tuple(ns.batches), ns.context, ns.repeats)
        if ns.output_json:
            with open(ns.output_json, "w") as f:
                json.dump(results, f, indent=2)
        return
    chosen = ns.workloads.split(",")
    if importlib.util.find_spec("easydel") is None:
        print("EasyDeL eSurge: skipped (easydel is not installed)")
    else:
        print("EasyDeL eSurge: skipped (installed, but this harness has no eSurge runner yet)")

    from vllm_jax import EngineArgs
    from vllm_jax.models.registry import resolve_architecture

    spec = resolve_architecture(EngineArgs().create_config().model_config.hf_config)[1]
    params = spec.vocab_size * spec.hidden_size + spec.num_layers * (
        spec.hidden_size * (spec.q_size + 2 * spec.kv_size) + spec.q_size * spec.hidden_size
        + 3 * spec.hidden_size * spec.intermediate_size)
    floors = measure_floors(spec.hidden_size, spec.intermediate_size)
    print(f"floors: {floors['matmul_gflops']:.1f} GFLOP/s (f32 matmul 512x{spec.hidden_size}x"
          f"{spec.intermediate_size}), {floors['bandwidth_gbs']:.1f} GB/s; {params / 1e6:.0f}M params")
    loads = workloads(spec.vocab_size)
    hf_model = None if ns.skip_transformers else load_transformers()
    rows, results = [], {"floors": floors}
    for name in chosen:
        requests = loads[name]
        tokens = sum(len(p) + n for p, n in requests)
        args = dict(max_model_len=2048, enable_prefix_caching=name == "D")
        ours_s, ours_out, warm = run_engine(requests, **args)
        entry = {"ours_tok_s": ours_out / ours_s, "ours_warmup_s": warm}
        if name == "C":
            kv_bytes = 2 * spec.num_layers * spec.kv_size * 4 * (len(requests[0][0]) + requests[0][1] / 2)
            floor_s = ours_out * (params * 4 + kv_bytes) / (floors["bandwidth_gbs"] * 1e9)
        else:
            if name == "D":  # with prefix caching the shared prompt is computed once
                shared = len(os.path.commonprefix([p for p, _ in requests]))
                tokens -= shared * (len(requests) - 1)
            floor_s = 2 * params * tokens / (floors["matmul_gflops"] * 1e9)
        entry["ours_share_of_floor"] = floor_s / ours_s
        if name == "D":
            off_s, off_out, _ = run_engine(requests, max_model_len=2048, enable_prefix_caching=False)
            entry["prefix_caching_speedup"] = (ours_out / ours_s) / (off_out / off_s)
        elif hf_model is not None:
            hf_s, hf_out, hf_first = run_transformers(hf_model, requests)
            entry.update(hf_tok_s=hf_out / hf_s, ratio=(ours_out / ours_s) / (hf_out / hf_s),
                         hf_first_batch_s=hf_first)
        results[name] = entry
        rows.append((name, entry))
        print(name, json.dumps({k: round(v, 3) for k, v in entry.items()}), flush=True)
    print("\n| workload | ours tok/s | share of floor | transformers tok/s | ratio | warm-up s |")
    print("|---|---|---|---|---|---|")
    for name, e in rows:
        hf = f"{e['hf_tok_s']:.1f}" if "hf_tok_s" in e else "-"
        ratio = f"{e['ratio']:.2f}x" if "ratio" in e else (
            f"prefix caching {e['prefix_caching_speedup']:.2f}x" if "prefix_caching_speedup" in e else "-")
        print(f"| {name} | {e['ours_tok_s']:.1f} | {100 * e['ours_share_of_floor']:.0f}% | {hf} | {ratio} | "
              f"{e['ours_warmup_s']:.1f} |")
    if ns.output_json:
        with open(ns.output_json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

"""Multi-LoRA throughput: a batch of requests with 0, 1 and 4 distinct adapters against the base model.

    python benchmarks/lora.py [--model M] [--num-prompts 32] [--input-len 32] [--output-len 64] [--rank 16]

Two engines side by side: the base model without LoRA, and the same model with --enable-lora --max-loras 4 and
random PEFT adapters of --rank on all seven targets (q/k/v/o, gate/up/down), written here with numpy in PEFT's
file layout.
Each run generates exactly --output-len tokens per request (ignore_eos) and reports output tokens/s, its cost
against the base engine, and the compile count after warm-up (it must not move when adapters change). The target
(issue 19): 4 adapters cost at most 25% of the base throughput on CPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from engine_share import device_share
from safetensors.numpy import save_file

TARGETS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_adapter(path: Path, features: dict[str, tuple[int, int]], num_layers: int, rank: int, seed: int) -> None:
    """A random PEFT LoRA adapter (small values: the outputs stay finite) for a model of these shapes."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(num_layers):
        for name, (fin, fout) in features.items():
            key = f"base_model.model.model.layers.{layer}.{TARGETS[name]}.{name}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, fin)) * 0.02).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((fout, rank)) * 0.02).astype(np.float32)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS), "bias": "none"}))


def run(llm, prompts, params, loras) -> dict:
    engine = llm.llm_engine
    before = engine.runner.num_compilations
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    elapsed = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"elapsed_s": elapsed, "output_tokens_per_s": tokens / elapsed,
            "compilations_during_run": engine.runner.num_compilations - before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the cases; each case's best is reported")
    parser.add_argument("--output-json", default=None)
    ns = parser.parse_args()

    from vllm_jax import LLM, LoRARequest, SamplingParams
    from vllm_jax.lora.device.slots import target_shapes

    params = SamplingParams(temperature=1.0, max_tokens=ns.output_len, ignore_eos=True, seed=0)
    engine_args = dict(max_num_seqs=ns.num_prompts, max_model_len=ns.input_len + ns.output_len + 16,
                       **device_share(2))
    results: dict[str, dict] = {}

    base_llm = LLM(ns.model, **engine_args)
    vocab = base_llm.llm_engine.vocab_size
    rng = np.random.default_rng(0)
    prompts = [{"prompt_token_ids": rng.integers(0, vocab, ns.input_len).tolist()} for _ in range(ns.num_prompts)]
    shapes = target_shapes(base_llm.llm_engine.runner.spec)
    with tempfile.TemporaryDirectory() as tmp:
        adapters = []
        for i in range(4):
            write_adapter(Path(tmp) / f"a{i}", shapes.features, shapes.num_layers, ns.rank, seed=i)
            adapters.append(LoRARequest(f"a{i}", i + 1, str(Path(tmp) / f"a{i}")))
        lora_llm = LLM(ns.model, enable_lora=True, max_loras=4, max_lora_rank=ns.rank, **engine_args)
        cases = {"base": (base_llm, None), "lora engine, 0 adapters": (lora_llm, None),
                 "1 adapter": (lora_llm, [adapters[0]] * ns.num_prompts),
                 "4 adapters": (lora_llm, [adapters[i % 4] for i in range(ns.num_prompts)])}
        # Rounds over every case, best of the rounds: a shared machine's load drifts, and interleaving keeps that
        # drift from favouring whichever case ran first.
        for _ in range(ns.repeats):
            for name, (llm, loras) in cases.items():
                r = run(llm, prompts, params, loras)
                if name not in results or r["output_tokens_per_s"] > results[name]["output_tokens_per_s"]:
                    results[name] = r

    base = results["base"]["output_tokens_per_s"]
    print(f"{'case':<26} {'output tok/s':>12} {'cost vs base':>13} {'compiles':>9}")
    for name, r in results.items():
        r["cost_vs_base"] = 1 - r["output_tokens_per_s"] / base
        print(f"{name:<26} {r['output_tokens_per_s']:>12.1f} {r['cost_vs_base']:>12.1%} "
              f"{r['compilations_during_run']:>9}")
    if ns.output_json:
        Path(ns.output_json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

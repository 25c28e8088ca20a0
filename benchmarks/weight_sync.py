"""Weight sync for RL loops: update_weights against building a new engine, and sleep / wake times.

    python benchmarks/weight_sync.py [--model M] [--repeats 3] [--output-json out.json]

On the default model (SmolLM2-135M GGUF, dequantized) unless --model names an HF directory or GGUF file. Times:
- a new engine: LLM(...) from start to ready (load + warm-up; the compilation cache as configured, so a warm
  cache makes it a load of stored programs, the case an RL loop that restarts its engine would see);
- update_weights with every tensor as host numpy arrays (read, cast, placed), as jax.Arrays already on the
  device (transposed and cast there), and from the checkpoint path;
- sleep(1) / wake_up() and sleep(2) / wake_up(), with the engine's device bytes awake and asleep;
and the compile count, which must not move. The target (issue 33): an update at least 20x faster than a new
engine. Figures on a shared CPU are under contention: compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from vllm_jax import LLM, SamplingParams
from vllm_jax.worker.weight_update import as_checkpoint

ENGINE_ARGS = dict(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32, enable_sleep_mode=True)


def timed(fn, repeats: int) -> float:
    """The best of `repeats` wall times of fn() (seconds), each finished on the device."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    llm = LLM(args.model, **ENGINE_ARGS)
    new_engine_s = time.perf_counter() - t0
    engine = llm.llm_engine
    runner = engine.runner
    source = engine.config.model_config.source
    checkpoint = as_checkpoint(source.path)
    host = {name: np.asarray(checkpoint.read(name, tuple(slice(None) for _ in checkpoint.shape(name))), np.float32)
            for name in sorted(checkpoint.names())}
    device = {name: jax.device_put(array) for name, array in host.items()}
    weight_bytes = sum(a.nbytes for a in host.values())
    params = SamplingParams(temperature=0.0, max_tokens=8)
    before = llm.generate(["The capital of France is"], params, use_tqdm=False)[0].outputs[0].text
    compilations = runner.num_compilations

    result = dict(model=source.path, tensors=len(host), weight_bytes=weight_bytes, new_engine_s=new_engine_s,
                  warmup_s=engine.warmup_seconds)
    result["update_host_numpy_s"] = timed(lambda: llm.update_weights(host.items()), args.repeats)
    result["update_device_jax_s"] = timed(lambda: llm.update_weights(device.items()), args.repeats)
    result["update_from_path_s"] = timed(lambda: llm.update_weights(source.path), args.repeats)
    sleep_mode = runner.sleep_mode
    result["device_bytes_awake"] = sleep_mode.device_bytes()
    for level in (1, 2):
        t0 = time.perf_counter()
        llm.sleep(level=level)
        result[f"sleep{level}_s"] = time.perf_counter() - t0
        result[f"device_bytes_asleep{level}"] = sleep_mode.device_bytes()
        if level == 2:  # the weights were dropped: the loop updates them before waking
            t0 = time.perf_counter()
            llm.update_weights(device.items())
            result["update_while_asleep_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        llm.wake_up()
        jax.block_until_ready(runner.params)
        result[f"wake{level}_s"] = time.perf_counter() - t0
    after = llm.generate(["The capital of France is"], params, use_tqdm=False)[0].outputs[0].text
    result["same_text_after"] = after == before
    result["compilations_after_warmup"] = runner.num_compilations - compilations
    result["new_engine_over_update"] = new_engine_s / result["update_device_jax_s"]

    print(f"model {source.path}: {len(host)} tensors, {weight_bytes / 2**20:.1f} MiB float32")
    print(f"new engine (load + warm-up)       {new_engine_s:8.2f} s   (warm-up {engine.warmup_seconds:.2f} s)")
    for key, label in (("update_host_numpy_s", "update_weights, host numpy"),
                       ("update_device_jax_s", "update_weights, jax on device"),
                       ("update_from_path_s", "update_weights, checkpoint path"),
                       ("sleep1_s", "sleep(level=1)"), ("wake1_s", "wake_up() after level 1"),
                       ("sleep2_s", "sleep(level=2)"), ("update_while_asleep_s", "update while asleep (level 2)"),
                       ("wake2_s", "wake_up() after level 2")):
        print(f"{label:34s}{result[key]:8.3f} s")
    print(f"device bytes: awake {result['device_bytes_awake']}, asleep level 1 {result['device_bytes_asleep1']}, "
          f"level 2 {result['device_bytes_asleep2']}")
    print(f"new engine / update (jax): {result['new_engine_over_update']:.1f}x; compilations after warm-up: "
          f"{result['compilations_after_warmup']}; same greedy text after sleep / wake: {result['same_text_after']}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()

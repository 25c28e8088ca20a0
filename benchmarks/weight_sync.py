"""Weight sync for RL loops: update_weights against building a new engine, and sleep / wake times.

    python benchmarks/weight_sync.py [--model M] [--repeats 3] [--output-json out.json]
    python benchmarks/weight_sync.py --llama3-8b-shape [--repeats 3]

On the default model (SmolLM2-135M GGUF, dequantized) unless --model names an HF directory or GGUF file. Times:
- a new engine: LLM(...) from start to ready (load + warm-up; the compilation cache as configured, so a warm
  cache makes it a load of stored programs, the case an RL loop that restarts its engine would see);
- update_weights with every tensor as host numpy arrays (read, cast, placed), as jax.Arrays already on the
  device (transposed and cast there), and from the checkpoint path;
- sleep(1) / wake_up() and sleep(2) / wake_up(), with the engine's device bytes awake and asleep;
and the compile count, which must not move. The target (issue 33): an update at least 20x faster than a new
engine. Figures on a shared CPU are under contention: compare ratios, not seconds.

`--llama3-8b-shape`: a Llama-3-8B-shaped update without its 16 GB (which a CPU test machine does not hold): the
tensor count and bytes of the full update (bfloat16, from the abstract model), the time of its validation
(`WeightUpdater.plan` over the abstract params: every name, shape and layer checked), and the time of the whole
update (read, cast, place, swap) of a stand-in with the same 291 tensors and 32 layers at 1/16 of the widths
(random weights, no engine), from host numpy and from jax.Arrays on the device. The full update's time is then
about the stand-in's plus the full bytes over the host-to-device bandwidth (measured too, on one 256 MiB array).
"""

from __future__ import annotations

import argparse
import json
import time
import types

import jax
import numpy as np
from flax import nnx

from vllm_jax import LLM, SamplingParams
from vllm_jax.worker.weight_update import ArrayCheckpoint, WeightUpdater, as_checkpoint

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
    parser.add_argument("--llama3-8b-shape", action="store_true",
                        help="count and time a Llama-3-8B-shaped update abstractly / on a 1/16-width stand-in")
    args = parser.parse_args(argv)
    if args.llama3_8b_shape:
        return llama3_8b_shape(args.repeats, args.output_json)

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


LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=8192,
                 rope_theta=500000.0, tie_word_embeddings=False)


class ShapeCheckpoint:
    """HF names and shapes only: what validating an update reads (`WeightUpdater.plan`)."""

    path = "abstract"

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        self.shapes = shapes

    def names(self) -> set[str]:
        return set(self.shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]


def _llama_model(scale: int, dtype: str, abstract: bool):
    """(params, spec, model config stand-in, HF name -> shape) of a Llama-3-8B shape, widths / `scale`."""
    import transformers

    from vllm_jax.model_loader.loader import build_model
    from vllm_jax.models.registry import param_sources, resolve_architecture

    fields = dict(LLAMA3_8B)
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        fields[key] = max(1, fields[key] // scale)  # head_dim stays 128
    config = transformers.LlamaConfig(**fields, architectures=["LlamaForCausalLM"])
    entry, spec = resolve_architecture(config)
    model = build_model(entry, spec, dtype, None, platform="cpu", abstract=abstract)
    params = nnx.state(model, nnx.Param)
    model_config = types.SimpleNamespace(dtype=dtype, quantization=None, quantization_online=False)
    updater = WeightUpdater(params, spec, model_config)
    hf_shapes = {name: updater.sources[path].hf_shape(updater.shapes[path])
                 for path, src in param_sources(spec).items() if path in updater.shapes for name in src.names.flat}
    return params, spec, model_config, hf_shapes


def llama3_8b_shape(repeats: int, output_json: str | None) -> dict:
    params, spec, model_config, shapes = _llama_model(1, "bfloat16", abstract=True)
    full_bytes = sum(int(np.prod(s)) * 2 for s in shapes.values())
    updater = WeightUpdater(params, spec, model_config)
    checkpoint = ShapeCheckpoint(shapes)
    result = dict(tensors=len(shapes), bytes_bfloat16=full_bytes,
                  validate_s=timed(lambda: updater.plan(checkpoint), repeats))
    params, spec, model_config, small = _llama_model(16, "bfloat16", abstract=False)
    rng = np.random.default_rng(0)
    host = {name: rng.standard_normal(shape, np.float32) for name, shape in small.items()}
    device = {name: jax.device_put(a.astype(jax.numpy.bfloat16)) for name, a in host.items()}
    updater = WeightUpdater(params, spec, model_config)
    result.update(standin_scale=16, standin_tensors=len(host),
                  standin_bytes_bfloat16=sum(a.size * 2 for a in host.values()),
                  standin_update_host_numpy_s=timed(lambda: updater.update(ArrayCheckpoint(host.items())), repeats),
                  standin_update_device_jax_s=timed(lambda: updater.update(ArrayCheckpoint(device.items())),
                                                    repeats))
    block = np.ones(128 * 2**20, np.float16)  # 256 MiB
    result["host_to_device_gib_s"] = block.nbytes / 2**30 / timed(lambda: jax.device_put(block), repeats)
    result["projected_full_update_host_s"] = (result["standin_update_host_numpy_s"]
                                              + full_bytes / 2**30 / result["host_to_device_gib_s"])
    print(f"Llama-3-8B shape: {result['tensors']} tensors, {full_bytes / 1e9:.2f} GB in bfloat16")
    print(f"validation of the full update (abstract)          {result['validate_s']:8.3f} s")
    print(f"stand-in 1/16 width ({result['standin_tensors']} tensors, {result['standin_bytes_bfloat16'] / 2**20:.1f} "
          "MiB):")
    print(f"  update_weights, host numpy (float32 -> bf16)      {result['standin_update_host_numpy_s']:8.3f} s")
    print(f"  update_weights, jax bf16 on device                {result['standin_update_device_jax_s']:8.3f} s")
    print(f"host -> device bandwidth                          {result['host_to_device_gib_s']:8.2f} GiB/s")
    print(f"projected full update from host numpy             {result['projected_full_update_host_s']:8.1f} s")
    if output_json:
        with open(output_json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()

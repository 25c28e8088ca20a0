"""Host share of an engine step with many running requests, broken down by stage, against the device work.

    python benchmarks/host_overhead.py [--num-requests 64 256 1024] [--input-len 16] [--output-len 32]
                                       [--profile 256]

Each decode step (every request running, one token each) is split into
  schedule  Scheduler.schedule
  prepare   ModelRunner._prepare: packing the step's arrays and the sampling tensors
  device    DeviceStep.run: transfer, the jitted forward and sampler, the result back to host numpy
  output    ModelRunner._to_output + Scheduler.update_from_output + OutputProcessor.process_outputs
  other     the rest of LLMEngine.step (the runner's request-state update, bookkeeping)
The device waits for the host for everything but `device`: the share printed last. The model is a one-layer Llama
with random weights built on the fly (hidden 64, vocab 32000 so vocabulary-sized host work shows), so device time
is small and the host's cost stands out; `--model` runs another checkpoint instead (`default`: the engine's). `--profile N` runs cProfile
over the decode steps of an extra N-request run and prints the top functions by own time and by cumulative time.
Steps that compiled a program are left out (the engine is not warmed up, so only the buckets used compile).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

STAGES = ("schedule", "prepare", "device", "output", "other")
TINY_VOCAB = 32000


def build_tiny_llama(path: Path, vocab_size: int = TINY_VOCAB) -> None:
    """A one-layer Llama with random weights and a word-level tokenizer covering every id, saved to `path`."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
                         eos_token_id=2, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(path)


class StageTimer:
    """Wraps an object's methods so each call's wall time is added to a named stage."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, obj: object, method: str, stage: str) -> None:
        real: Callable = getattr(obj, method)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - t0

        setattr(obj, method, timed)


def measure(model: str | None, num_requests: int, input_len: int, output_len: int,
            profile: cProfile.Profile | None = None) -> dict[str, float]:
    """Median ms per decode step of each stage (and `step`, `steps`) with `num_requests` running requests."""
    from vllm_jax import EngineArgs, SamplingParams
    from vllm_jax.engine.llm_engine import LLMEngine

    # Buckets of exactly num_requests tokens (the decode steps, no padding) and 4x that (prompt chunks).
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=model, dtype="float32", max_num_seqs=num_requests, max_num_batched_tokens=4 * num_requests,
        min_token_bucket=num_requests, min_seq_bucket=num_requests, bucket_growth=4,
        max_model_len=input_len + output_len + 16), warmup=False, show_progress=False)
    timer = StageTimer()
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(engine.runner, "_prepare", "prepare")
    timer.wrap(engine.runner.device, "run", "device")
    for obj, method in ((engine.runner, "_to_output"), (engine.scheduler, "update_from_output"),
                        (engine.output_processor, "process_outputs")):
        timer.wrap(obj, method, "output")
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i in range(num_requests):
        engine.add_request(str(i), rng.integers(3, engine.vocab_size, input_len).tolist(), params)
    per_step: dict[str, list[float]] = defaultdict(list)
    profiled_steps = 0
    while engine.has_unfinished_requests():
        timer.seconds.clear()
        compiled = engine.runner.num_compilations
        # Profiled: decode steps after the first one that compiled nothing (the later ones reuse its program).
        profiled = profile is not None and bool(per_step) and len(engine.scheduler.running) == num_requests
        if profiled:
            profile.enable()
        t0 = time.perf_counter()
        engine.step()
        step = time.perf_counter() - t0
        if profiled:
            profile.disable()
            profiled_steps += 1
        batch = engine.last_step.scheduled.num_scheduled_tokens if engine.last_step else {}
        if (len(batch) == num_requests and all(n == 1 for n in batch.values())
                and engine.runner.num_compilations == compiled):
            per_step["step"].append(step)
            for stage in STAGES[:-1]:
                per_step[stage].append(timer.seconds[stage])
            per_step["other"].append(step - sum(timer.seconds[s] for s in STAGES[:-1]))
    if not per_step:
        raise RuntimeError("no decode step ran without compiling: raise --output-len")
    # Medians: the CPU may be shared, and one slow step should not move a stage's figure.
    return {name: 1000 * float(np.median(v)) for name, v in per_step.items()} | {
        "steps": len(per_step["step"]), "profiled": profiled_steps}


def print_table(rows: dict[int, dict[str, float]]) -> None:
    print("| running requests | step ms | " + " | ".join(f"{s} ms" for s in STAGES) + " | device waits |")
    print("|---:|---:|" + "---:|" * len(STAGES) + "---:|")
    for n, r in rows.items():
        waits = 1 - r["device"] / r["step"]
        print(f"| {n} | {r['step']:.2f} | " + " | ".join(f"{r[s]:.2f}" for s in STAGES) + f" | {100 * waits:.0f}% |")


def print_profile(profile: cProfile.Profile, steps: int, top: int = 25) -> None:
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(top)
        print(f"--- cProfile over {steps} decode steps, by {order} (seconds are the profiled total) ---")
        print(out.getvalue().split("\n", 4)[-1].rstrip())  # drop pstats' header lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny",
                        help="tiny (the one-layer random Llama), default (the engine's embedded model) or a path")
    parser.add_argument("--num-requests", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--profile", type=int, default=None, metavar="N", help="cProfile a run of N requests")
    parser.add_argument("--profile-out", default=None, help="also save the profile's pstats here")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = {"tiny": tmp, "default": None}.get(ns.model, ns.model)
        if ns.model == "tiny":
            build_tiny_llama(Path(tmp))
        rows: dict[int, dict[str, float]] = {}
        for n in ns.num_requests:
            rows[n] = measure(model, n, ns.input_len, ns.output_len)
            print(f"{n} running requests: {rows[n]['steps']} decode steps, {rows[n]['step']:.2f} ms/step",
                  flush=True)
        if ns.profile is not None:  # a run of its own: the profiler's overhead stays out of the table
            profile = cProfile.Profile()
            profiled = measure(model, ns.profile, ns.input_len, ns.output_len, profile)
            print_profile(profile, int(profiled["profiled"]))
            if ns.profile_out:
                profile.dump_stats(ns.profile_out)
    print_table(rows)


if __name__ == "__main__":
    main()

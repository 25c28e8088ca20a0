"""Host share of an engine step with many running requests, broken down by stage, sync and async scheduling.

    python benchmarks/host_overhead.py [--num-requests 64 256 1024] [--input-len 16] [--output-len 32]
                                       [--modes sync async] [--profile 256] [--baseline PATH] [--stat min]

Each decode step (every request running, one token each) is split into
  schedule  Scheduler.schedule
  prepare   ModelRunner._prepare: the step's arrays and sampling tensors from the persistent input batch
  launch    DeviceStep.launch: handing the step's programs to jax (which runs them asynchronously)
  wait      DeviceStep.fetch: the host blocked until the device's result is on the host
  output    ModelRunner._to_output + Scheduler.update_from_output + OutputProcessor.process_outputs
  other     the rest of LLMEngine.step
Sync, the device works during launch + wait only, and waits for the host the rest of the step. Async
(--async-scheduling), one step() dispatches step n + 1 before it waits for step n, so the host's work overlaps the
device's; the device then waits only where the host's whole loop takes longer than a step of device work, which
is estimated as 1 - (sync launch + wait) / (async step). Every row also gives the decode throughput (requests /
step time), and each mode's end-to-end output tok/s over the whole run (prefill included).

The model is a one-layer Llama with random weights built on the fly (hidden 64, vocab 32000 so vocabulary-sized
host work shows), so device time is small and the host's cost stands out; `--model` runs another checkpoint
instead (`default`: the engine's). `--profile N` runs cProfile over the decode steps of an extra N-request run
(the first mode) and prints the top functions by own time and by cumulative time. `--baseline PATH` also times
the end-to-end run with the vllm_jax package of another checkout (e.g. `git worktree add /tmp/base <commit>`),
in a subprocess, in the same run, for a ratio. Steps that compiled a program are left out (no warm-up: only the
buckets used compile). Each stage's figure is its median over the decode steps; `--stat min` gives the minimum
instead, the steadier figure on a shared CPU, where other processes only ever add time. With PYTHONPATH set to
another checkout, the table is that revision's (the stages are the same methods there).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

STAGES = ("schedule", "prepare", "launch", "wait", "output", "other")
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
        self._wrapped: list[tuple[object, str, Callable]] = []

    def wrap(self, obj: object, method: str, stage: str) -> None:
        real: Callable = getattr(obj, method)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - t0

        setattr(obj, method, timed)
        self._wrapped.append((obj, method, real))

    def unwrap(self) -> None:
        """Put every wrapped method back (the engine then runs on untimed)."""
        for obj, method, real in reversed(self._wrapped):
            setattr(obj, method, real)
        self._wrapped.clear()


def _engine(model: str, num_requests: int, input_len: int, output_len: int, async_scheduling: bool | None):
    from vllm_jax import EngineArgs
    from vllm_jax.engine.llm_engine import LLMEngine

    # Buckets of exactly num_requests tokens (the decode steps, no padding) and 4x that (prompt chunks).
    extra = {} if async_scheduling is None else {"async_scheduling": async_scheduling}
    return LLMEngine.from_engine_args(EngineArgs(
        model=model, dtype="float32", max_num_seqs=num_requests, max_num_batched_tokens=4 * num_requests,
        min_token_bucket=num_requests, min_seq_bucket=num_requests, bucket_growth=4,
        max_model_len=input_len + output_len + 16, **extra), warmup=False, show_progress=False)


def _add_requests(engine, num_requests: int, input_len: int, output_len: int, tag: str = "") -> None:
    """Greedy requests whose outputs come once, at the end, as `LLM.generate` and non-streaming server requests
    ask for them (FINAL_ONLY)."""
    from vllm_jax.sampling_params import RequestOutputKind, SamplingParams

    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    for i in range(num_requests):
        engine.add_request(f"{tag}{i}", rng.integers(3, engine.vocab_size, input_len).tolist(), params)


def end_to_end(model: str, num_requests: int, input_len: int, output_len: int,
               async_scheduling: bool | None, engine=None) -> float:
    """Output tok/s of `num_requests` greedy requests run to the end, after a first identical run that compiles.

    Builds its engine from `model` unless given one. Uses only the engine API every revision has (for
    --baseline)."""
    engine = engine or _engine(model, num_requests, input_len, output_len, async_scheduling)
    busy = getattr(engine, "has_work", engine.has_unfinished_requests)
    rates = []
    for run in range(3):
        _add_requests(engine, num_requests, input_len, output_len, tag=f"e2e{run}-")
        t0 = time.perf_counter()
        tokens = 0
        while busy():
            tokens += sum(len(o.outputs[0].token_ids) for o in engine.step() if o.finished)
        if run:  # the first run compiled the programs
            rates.append(tokens / (time.perf_counter() - t0))
    return float(max(rates))


def measure(engine, num_requests: int, input_len: int, output_len: int, profile: cProfile.Profile | None = None,
            stat: str = "median", tag: str = "") -> dict[str, float]:
    """Median (or `stat`) ms per decode step of each stage (and `step`, `steps`) with `num_requests` running
    requests, on `engine` (its methods timed for the run only)."""
    timer = StageTimer()
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(engine.runner, "_prepare", "prepare")
    timer.wrap(engine.runner.device, "launch", "launch")
    timer.wrap(engine.runner.device, "fetch", "wait")
    for obj, method in ((engine.runner, "_to_output"), (engine.scheduler, "update_from_output"),
                        (engine.output_processor, "process_outputs")):
        timer.wrap(obj, method, "output")
    _add_requests(engine, num_requests, input_len, output_len, tag=tag)
    per_step: dict[str, list[float]] = defaultdict(list)
    profiled_steps = 0
    while engine.has_work():
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
        record = engine.last_step
        decoding = record is not None and all(len(s.num_scheduled_tokens) == num_requests and
                                              set(s.num_scheduled_tokens.values()) == {1} for s in record.scheduled)
        if decoding and len(record.scheduled) == 1 and engine.runner.num_compilations == compiled:
            per_step["step"].append(step)
            for stage in STAGES[:-1]:
                per_step[stage].append(timer.seconds[stage])
            per_step["other"].append(step - sum(timer.seconds[s] for s in STAGES[:-1]))
            per_step["busy"].append(step - timer.seconds["wait"])  # per step: a min of differences, not of parts
    timer.unwrap()
    if not per_step:
        raise RuntimeError("no decode step ran without compiling: raise --output-len")
    # Medians (or minima): the CPU may be shared, and one slow step should not move a stage's figure.
    reduce = {"median": np.median, "min": np.min}[stat]
    return {name: 1000 * float(reduce(v)) for name, v in per_step.items()} | {
        "steps": len(per_step["step"]), "profiled": profiled_steps}


def print_table(rows: dict[tuple[int, str], dict[str, float]]) -> None:
    print("| running requests | scheduling | step ms | " + " | ".join(f"{s} ms" for s in STAGES)
          + " | host busy ms | device waits | decode tok/s |")
    print("|---:|---|---:|" + "---:|" * len(STAGES) + "---:|---:|---:|")
    for (n, mode), r in rows.items():
        sync = rows.get((n, "sync"))
        if mode == "sync":
            waits = f"{100 * (1 - (r['launch'] + r['wait']) / r['step']):.0f}%"
        elif sync is not None:
            waits = f"~{100 * max(0.0, 1 - (sync['launch'] + sync['wait']) / r['step']):.0f}%"
        else:
            waits = "-"
        print(f"| {n} | {mode} | {r['step']:.2f} | " + " | ".join(f"{r[s]:.2f}" for s in STAGES)
              + f" | {r['busy']:.2f} | {waits} | {1000 * n / r['step']:.0f} |")


def print_profile(profile: cProfile.Profile, steps: int, top: int = 25) -> None:
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(top)
        print(f"--- cProfile over {steps} decode steps, by {order} (seconds are the profiled total) ---")
        print(out.getvalue().split("\n", 4)[-1].rstrip())  # drop pstats' header lines


def baseline_tok_s(path: str, model: str, num_requests: int, input_len: int, output_len: int) -> float:
    """`end_to_end` with another checkout's vllm_jax (its defaults), in a subprocess started in that checkout, so
    that its package is the one imported (checked)."""
    root = Path(path).resolve()
    # Loaded by path: the checkout's benchmarks/ must not come first on sys.path there.
    code = (f"import importlib.util as u; import vllm_jax; "
            f"assert vllm_jax.__file__.startswith({str(root)!r}), vllm_jax.__file__; "
            f"s = u.spec_from_file_location('host_overhead', {str(Path(__file__).resolve())!r}); "
            f"h = u.module_from_spec(s); s.loader.exec_module(h); "
            f"print(h.end_to_end({model!r}, {num_requests}, {input_len}, {output_len}, None))")
    env = os.environ | {"PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the baseline run failed: {proc.stderr[-2000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny",
                        help="tiny (the one-layer random Llama), default (the engine's embedded model) or a path")
    parser.add_argument("--num-requests", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--modes", nargs="+", choices=("sync", "async"), default=["sync", "async"])
    parser.add_argument("--stat", choices=("median", "min"), default="median",
                        help="each stage's figure over the decode steps")
    parser.add_argument("--profile", type=int, default=None, metavar="N", help="cProfile a run of N requests")
    parser.add_argument("--profile-out", default=None, help="also save the profile's pstats here")
    parser.add_argument("--baseline", default=None, metavar="PATH",
                        help="a checkout of another revision: its end-to-end tok/s in the same run")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = {"tiny": tmp, "default": None}.get(ns.model, ns.model)
        if ns.model == "tiny":
            build_tiny_llama(Path(tmp))
        rows: dict[tuple[int, str], dict[str, float]] = {}
        tok_s: dict[tuple[int, str], float] = {}
        engines = {}  # (requests, mode) -> its engine: the end-to-end runs, the stage table and the profile share it
        for n in ns.num_requests:
            if ns.baseline:
                tok_s[n, "baseline"] = baseline_tok_s(ns.baseline, model, n, ns.input_len, ns.output_len)
            for mode in ns.modes:
                engine = engines[n, mode] = _engine(model, n, ns.input_len, ns.output_len, mode == "async")
                tok_s[n, mode] = end_to_end(model, n, ns.input_len, ns.output_len, mode == "async", engine)
                rows[n, mode] = measure(engine, n, ns.input_len, ns.output_len, stat=ns.stat, tag="stages-")
                print(f"{n} running requests, {mode}: {rows[n, mode]['steps']} decode steps, "
                      f"{rows[n, mode]['step']:.2f} ms/step, end to end {tok_s[n, mode]:.0f} output tok/s",
                      flush=True)
        if ns.profile is not None:  # a run of its own: the profiler's overhead stays out of the table
            profile = cProfile.Profile()
            mode = ns.modes[0]
            engine = engines.get((ns.profile, mode)) or _engine(model, ns.profile, ns.input_len, ns.output_len,
                                                                mode == "async")
            profiled = measure(engine, ns.profile, ns.input_len, ns.output_len, profile, tag="profiled-")
            print_profile(profile, int(profiled["profiled"]))
            if ns.profile_out:
                profile.dump_stats(ns.profile_out)
    print_table(rows)
    print()
    print("| running requests | " + " | ".join(f"{label} tok/s" for label in ["baseline"] * bool(ns.baseline)
                                               + ns.modes) + " |")
    print("|---:|" + "---:|" * (len(ns.modes) + bool(ns.baseline)))
    for n in ns.num_requests:
        cells = [tok_s[n, label] for label in ["baseline"] * bool(ns.baseline) + ns.modes]
        base = tok_s.get((n, "baseline"))
        print(f"| {n} | " + " | ".join(f"{c:.0f}" + (f" ({c / base:.2f}x)" if base and i else "")
                                       for i, c in enumerate(cells)) + " |")
    print(json.dumps({f"{n}/{label}": round(v, 1) for (n, label), v in tok_s.items()}))


if __name__ == "__main__":
    main()

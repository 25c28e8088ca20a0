"""Host share of an engine step with many running requests: schedule + pack inputs + process outputs, against
the device work (the jitted forward and sampler, `DeviceStep.run`), measured on the same steps.

    python benchmarks/host_overhead.py [--num-requests 64] [--input-len 32] [--output-len 64]

Every request is admitted first; the figures cover the steps in which all of them decode together.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    ns = parser.parse_args()

    from vllm_jax import EngineArgs, SamplingParams
    from vllm_jax.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(EngineArgs(
        model=ns.model, max_num_seqs=ns.num_requests,
        max_num_batched_tokens=max(512, ns.num_requests * ns.input_len)), show_progress=False)
    device = engine.runner.device
    device_seconds: list[float] = []
    real_run = device.run

    def timed_run(payload):
        t0 = time.perf_counter()
        result = real_run(payload)  # returns host numpy: the device work has finished
        device_seconds.append(time.perf_counter() - t0)
        return result

    device.run = timed_run
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=ns.output_len, ignore_eos=True)
    for i in range(ns.num_requests):
        engine.add_request(str(i), rng.integers(100, engine.vocab_size, ns.input_len).tolist(), params)
    steps: list[tuple[float, float]] = []
    while engine.has_unfinished_requests():
        device_seconds.clear()
        t0 = time.perf_counter()
        engine.step()
        total = time.perf_counter() - t0
        batch = engine.last_step.scheduled.num_scheduled_tokens if engine.last_step else {}
        if len(batch) == ns.num_requests and all(n == 1 for n in batch.values()):
            steps.append((total, sum(device_seconds)))
    totals, devices = np.array([s[0] for s in steps]), np.array([s[1] for s in steps])
    host = totals - devices
    print(f"{len(steps)} decode steps with {ns.num_requests} running requests: step {1000 * totals.mean():.1f} ms, "
          f"device {1000 * devices.mean():.1f} ms, host {1000 * host.mean():.1f} ms "
          f"({100 * host.sum() / totals.sum():.1f}% of step time)")


if __name__ == "__main__":
    main()

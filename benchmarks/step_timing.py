"""Device-step timings on the default model (or --model): compile time per program, layers scanned vs unrolled,
and decode step time as the KV cache grows (it must stay flat: the donated cache is never copied).

    python benchmarks/step_timing.py [--model M] [--blocks 256 2048 8192] [--batch 8] [--context 256]
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from vllm_jax import EngineArgs
from vllm_jax.worker.batch import RowChunk, pack_step_inputs
from vllm_jax.worker.model_runner import ModelRunner


def decode_inputs(runner: ModelRunner, batch: int, context: int):
    blocks_per_seq = -(-(context + 1) // runner.block_size)
    rows = [RowChunk([5], context, list(range(1 + i * blocks_per_seq, 1 + (i + 1) * blocks_per_seq)))
            for i in range(batch)]
    num_tokens = next(b for b in runner.token_buckets if b >= batch)
    return pack_step_inputs(rows, block_size=runner.block_size, max_blocks_per_seq=runner.max_blocks_per_seq,
                            num_tokens_padded=num_tokens, num_seqs_padded=runner.seq_bucket(num_tokens))


def median_ms(fn, repeats: int = 10) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def compile_seconds(runner: ModelRunner, num_tokens: int) -> tuple[float, float]:
    inputs = pack_step_inputs([], block_size=runner.block_size, max_blocks_per_seq=runner.max_blocks_per_seq,
                              num_tokens_padded=num_tokens, num_seqs_padded=runner.seq_bucket(num_tokens))
    device = runner.device
    t0 = time.perf_counter()
    lowered = device._forward.lower(device.params, device.kv_cache, inputs)
    t1 = time.perf_counter()
    lowered.compile()
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--blocks", type=int, nargs="+", default=[256, 2048, 8192])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=256)
    ns = parser.parse_args()
    for scan in (False, True):
        runner = ModelRunner(EngineArgs(model=ns.model, scan_layers=scan, max_model_len=1024,
                                        num_gpu_blocks_override=ns.blocks[0]).create_config())
        mode = "scanned" if scan else "unrolled"
        for num_tokens in (16, 512):
            trace, xla = compile_seconds(runner, num_tokens)
            print(f"{mode:9s} compile T={num_tokens}: trace+lower {trace:.2f} s, XLA {xla:.2f} s")
        for batch in (1, ns.batch):
            inputs = decode_inputs(runner, batch, ns.context)
            print(f"{mode:9s} decode step, batch {batch} x {ns.context} context: "
                  f"{median_ms(lambda: runner.step(inputs)):.1f} ms")  # noqa: B023 - timed at once
    for num_blocks in ns.blocks:
        runner = ModelRunner(EngineArgs(model=ns.model, max_model_len=1024,
                                        num_gpu_blocks_override=num_blocks).create_config())
        inputs = decode_inputs(runner, ns.batch, ns.context)
        print(f"KV cache {num_blocks:5d} blocks ({runner.kv_cache.nbytes / 2**20:7.0f} MiB): decode step batch "
              f"{ns.batch} x {ns.context}: {median_ms(lambda: runner.step(inputs)):.1f} ms")  # noqa: B023 - timed at once


if __name__ == "__main__":
    main()

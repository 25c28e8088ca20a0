"""Device mode of the harness: decode throughput of a Llama-3-8B-shaped model on an accelerator, as tok/s and as
a share of the chip's measured memory bandwidth.

    python benchmarks/compare.py --device-mode [--device-shape llama3-8b|tiny] [--batches 1 8 32 64 128 256]

The model is made locally from a transformers LlamaConfig with random weights (bfloat16 on an accelerator, so
nothing is downloaded). Each batch decodes one token per sequence over a 1k-token context, through the
engine's jitted step (ModelRunner.step: bucketed inputs, the platform's attention kernel, the donated cache).
A decode step must read every weight once and each sequence's KV once, so its floor is
(weight bytes + batch x context x KV bytes per token) / bandwidth. `tiny` is a small shape for a CPU smoke run.
"""

from __future__ import annotations

import tempfile
import time

import numpy as np

from vllm_jax.utils import cdiv

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048),
}


def measure_bandwidth_gbs(num_bytes: int, repeats: int = 10) -> float:
    """Read bandwidth of the default device: a reduction over a `num_bytes` array."""
    import jax
    import jax.numpy as jnp

    big = jnp.ones((num_bytes // 4,), jnp.float32)
    reduce = jax.jit(lambda x: x.sum())
    jax.block_until_ready(reduce(big))
    t0 = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(reduce(big))
    return repeats * big.nbytes / (time.perf_counter() - t0) / 1e9


def run_device_mode(shape: str = "llama3-8b", batches: tuple[int, ...] = (1, 8, 32, 64, 128, 256),
                    context: int = 1024, repeats: int = 5) -> list[dict]:
    import jax
    from transformers import LlamaConfig

    from vllm_jax import EngineArgs
    from vllm_jax.worker.batch import RowChunk, pack_step_inputs
    from vllm_jax.worker.model_runner import ModelRunner

    on_cpu = jax.default_backend() == "cpu"
    dtype = "float32" if on_cpu else "bfloat16"
    block_size = 16
    blocks_per_seq = cdiv(context + 1, block_size)
    with tempfile.TemporaryDirectory() as model_dir:
        LlamaConfig(architectures=["LlamaForCausalLM"], **SHAPES[shape]).save_pretrained(model_dir)
        config = EngineArgs(model=model_dir, dtype=dtype, max_model_len=2 * context, block_size=block_size,
                            max_num_seqs=max(batches), max_num_batched_tokens=max(max(batches), 16),
                            num_gpu_blocks_override=1 + max(max(batches) * blocks_per_seq,
                                                            -(-2 * context // block_size))).create_config()
        runner = ModelRunner(config, random_weights=True)
    spec = runner.spec
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(runner.params))
    kv_bytes_per_token = runner.kv_cache.nbytes // (runner.num_blocks * block_size)
    bandwidth = measure_bandwidth_gbs(min(8 << 30, 4 * weight_bytes))
    print(f"{jax.devices()[0].device_kind}: {spec.num_layers} layers, {weight_bytes / 1e9:.2f} GB of {dtype} "
          f"weights, {kv_bytes_per_token / 1024:.0f} KiB of KV per token; measured read bandwidth "
          f"{bandwidth:.0f} GB/s", flush=True)
    rows_out = []
    for batch in batches:
        rows = [RowChunk([1], context, np.arange(1 + i * blocks_per_seq, 1 + (i + 1) * blocks_per_seq))
                for i in range(batch)]
        num_tokens = next(b for b in runner.token_buckets if b >= batch)
        inputs = pack_step_inputs(rows, block_size=block_size, max_blocks_per_seq=runner.max_blocks_per_seq,
                                  num_tokens_padded=num_tokens, num_seqs_padded=runner.seq_bucket(num_tokens))
        jax.block_until_ready(runner.step(inputs))  # compile
        compiled = runner.num_compilations
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(runner.step(inputs))
            times.append(time.perf_counter() - t0)
        step = float(np.median(times))
        floor = (weight_bytes + batch * context * kv_bytes_per_token) / (bandwidth * 1e9)
        row = dict(batch=batch, step_ms=1000 * step, tok_s=batch / step, share_of_bandwidth=floor / step,
                   context=context, num_tokens=num_tokens, num_layers=spec.num_layers,
                   weight_bytes=weight_bytes, kv_bytes_per_token=kv_bytes_per_token,
                   compilations_while_timed=runner.num_compilations - compiled)
        rows_out.append(row)
        print(f"batch {batch:4d} x {context} context: {row['step_ms']:8.2f} ms/step, {row['tok_s']:9.1f} tok/s, "
              f"{100 * row['share_of_bandwidth']:5.1f}% of measured bandwidth", flush=True)
    return rows_out

"""Attention and KV-write kernels on realistic shapes: microseconds and achieved HBM GB/s next to the peak.

    python benchmarks/attention_kernels.py         # on a TPU or GPU: every backend of the platform
    python benchmarks/attention_kernels.py --smoke # tiny shapes, any platform (CPU: interpret mode), checks the script
    python benchmarks/attention_kernels.py --json out.json  # the rows as JSON too (benchmarks/device_check.sh)

Llama-3-8B attention heads (32 q / 8 kv, head_dim 128), bfloat16, one layer of a stacked cache read through
`layer_index` as the model does. Rows: decode batches of 1-256 sequences at 1k-8k context, a mixed batch
(prefill chunks next to decodes), and the KV write of a decode step and of a prefill step. Columns: the XLA
reference, this platform's Pallas kernel, and jax's own shipped kernel where one exists (TPU: ragged paged
attention, same interleaved cache layout; GPU: paged attention, decode rows only, K/V re-laid out once
outside the timing). GB/s counts the bytes that must move at least once: every visible K/V row once, plus
q and the output (attention); the new rows read and written (KV write).

Two times per cell: `us`, the median wall time of a call timed from the host (each call waited for: launches and
the wait included), and on an accelerator `device us`, the call's kernels on the device's own clock (jax's
profiler: the kernel events of the device's plane, summed per call), with the kernels that took most of it in the
JSON. On an H200 the host-timed figures disagreed with the engine's own step (docs/accelerators.md, "On an NVIDIA
H200": the third lease); the device column says which part is the kernel.
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import json
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.attention import attention_backend_for
from vllm_jax.pallas_kernels.kv_layout import from_interleaved

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
DECODE = [(1, 1024), (1, 8192), (16, 2048), (64, 4096), (128, 2048), (256, 1024), (256, 4096)]
MIXED = dict(prefill=[(512, 0), (512, 1024), (512, 2048)], decodes=(253, 2048))  # (new tokens, context)
WRITES = [256, 2048]  # tokens written in one step
# Peak HBM bandwidth (GB/s) by device_kind substring, for the printout only.
PEAK_GBS = {"v5 lite": 819, "v5e": 819, "v5p": 2765, "v5": 2765, "v4": 1228, "v6 lite": 1640, "v6e": 1640,
            "v7": 7370, "h200": 4800, "h100": 3350, "a100": 2039, "l4": 300, "b200": 8000}


def peak_gbs(device) -> float | None:
    kind = device.device_kind.lower()
    return next((v for k, v in PEAK_GBS.items() if k in kind), None)


def make_batch(rng: np.random.Generator, seqs: list[tuple[int, int]], block_size: int, dtype, scale: int = 1):
    """Step arrays for sequences given as (new tokens, context); pages shuffled over a cache just big enough."""
    q_lens = np.array([n for n, _ in seqs])
    seq_lens = q_lens + np.array([c for _, c in seqs])
    pages = -(-seq_lens // block_size)
    num_blocks = int(pages.sum()) + 1
    width = int(pages.max())
    perm = rng.permutation(np.arange(1, num_blocks))
    tables = np.zeros((len(seqs), width), np.int32)
    start = 0
    for s, p in enumerate(pages):
        tables[s, :p] = perm[start:start + p]
        start += p
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    key_q, key_kv = jax.random.split(jax.random.key(int(rng.integers(1 << 30))))
    q = jax.random.normal(key_q, (int(q_lens.sum()), Q_HEADS // scale, HEAD_DIM), dtype)
    cache = jax.random.normal(key_kv, (1, num_blocks, block_size, 2 * KV_HEADS // scale, HEAD_DIM), dtype)
    arrays = dict(q=q, cache=cache, tables=jnp.asarray(tables), lens=jnp.asarray(seq_lens, jnp.int32),
                  qsl=jnp.asarray(qsl), num_seqs=jnp.asarray([len(seqs)], jnp.int32))
    kv_bytes = int(seq_lens.sum()) * cache.shape[3] * HEAD_DIM * cache.dtype.itemsize
    return arrays, kv_bytes + 2 * q.size * q.dtype.itemsize


def time_us(fn, *args, iters: int) -> float:
    """Median wall time of one call after a warm-up call (compile excluded)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def device_time(fn, iters: int) -> tuple[float, list[tuple[str, float]]] | None:
    """(microseconds per call on the device's clock, the kernels that took most of them), from a profiler trace of
    `iters` calls; None when the trace has no device plane."""
    jax.block_until_ready(fn())
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        for _ in range(iters):
            jax.block_until_ready(fn())
        jax.profiler.stop_trace()
        data = jax.profiler.ProfileData.from_file(glob.glob(f"{trace_dir}/plugins/profile/*/*.xplane.pb")[0])
    return kernel_time(data, iters)


def kernel_time(data, calls: int) -> tuple[float, list[tuple[str, float]]] | None:
    """The first device plane's kernel time per call: its "XLA Ops" line (TPU) or its compute streams (GPU:
    "Stream #N" lines, copies left out); None without one."""
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        lines = list(plane.lines)
        kernels = ([line for line in lines if line.name == "XLA Ops"]
                   or [line for line in lines if line.name.startswith("Stream") and "Memcpy" not in line.name])
        if not kernels:
            continue
        per_kernel: collections.Counter = collections.Counter()
        for line in kernels:
            for event in line.events:
                per_kernel[event.name] += event.duration_ns
        total_us = sum(per_kernel.values()) / 1e3 / calls
        return total_us, [(name, ns / 1e3 / calls) for name, ns in per_kernel.most_common(4)]
    return None


def in_layout(backend, cache: jax.Array) -> jax.Array:
    """The interleaved [.., 2 * kv_heads, head_dim] cache in `backend`'s own layout (pallas_tpu: lane-dense rows),
    built once, outside the timing."""
    return from_interleaved(cache) if backend.lane_dense else cache


def ours(name: str, b: dict):
    backend = attention_backend_for(name)
    fn = jax.jit(functools.partial(backend.attention, sm_scale=HEAD_DIM ** -0.5))
    cache = in_layout(backend, b["cache"])
    return lambda: fn(b["q"], cache, b["tables"], b["lens"], b["qsl"], b["num_seqs"], layer_index=jnp.int32(0))


def _shipped_gpu_blocks(pages: int) -> dict:
    """Its KV split count must divide the table width, and its page block the split."""
    splits = max(k for k in (1, 2, 4, 8, 16) if pages % k == 0)
    block = max(p for p in (1, 2, 4, 8) if (pages // splits) % p == 0)
    return dict(k_splits=splits, pages_per_compute_block=block)


def jax_shipped(platform: str, b: dict, decode_only: bool, **extra):
    """jax's own paged attention kernel for this platform, or None."""
    layer = b["cache"][0]
    if platform == "tpu":
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention as rpa
        fn = functools.partial(rpa, sm_scale=HEAD_DIM ** -0.5)
        return lambda: fn(b["q"], layer, b["lens"], b["tables"], b["qsl"], b["num_seqs"])
    if platform == "gpu" and decode_only:
        from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention
        k_pages = jnp.moveaxis(layer[:, :, 0::2], 2, 0)  # [H, pages, block, D], built once, outside the timing
        v_pages = jnp.moveaxis(layer[:, :, 1::2], 2, 0)
        fn = jax.jit(functools.partial(paged_attention, **_shipped_gpu_blocks(b["tables"].shape[1]), **extra))
        q = b["q"] * HEAD_DIM ** -0.5  # it takes no softmax scale
        return lambda: fn(q, k_pages, v_pages, b["tables"], b["lens"])
    return None


def attention_rows(platform: str, backends: list[str], block_size: int, dtype, iters: int, smoke: bool):
    rng = np.random.default_rng(0)
    scale = 4 if smoke else 1
    shapes = [(f"decode {n} x {c}", [(1, c - 1)] * n, True) for n, c in DECODE]
    shapes.append(("mixed 3x512 prefill + 253 decode", MIXED["prefill"] + [(1, MIXED["decodes"][1])]
                   * MIXED["decodes"][0], False))
    if smoke:
        shapes = [("decode 4 x 40", [(1, 39)] * 4, True), ("mixed 2x12 prefill + 3 decode",
                                                          [(12, 0), (12, 20)] + [(1, 30)] * 3, False)]
    for name, seqs, decode_only in shapes:
        batch, nbytes = make_batch(rng, seqs, block_size, dtype, scale)
        cells = []
        for backend in backends:
            cells.append((backend, _measure(ours(backend, batch), nbytes, iters)))
        shipped = None if smoke else jax_shipped(platform, batch, decode_only)
        if shipped is not None:
            cells.append(("jax shipped", _measure(shipped, nbytes, iters)))
        yield name, nbytes, cells
        del batch


def write_rows(backends: list[str], block_size: int, dtype, iters: int, smoke: bool):
    rng = np.random.default_rng(1)
    for tokens in ([12] if smoke else WRITES):
        heads = KV_HEADS // (4 if smoke else 1)
        num_blocks = 4 * tokens // block_size + 2
        slots = jnp.asarray(rng.permutation(np.arange(block_size, num_blocks * block_size))[:tokens], jnp.int32)
        k = jax.random.normal(jax.random.key(tokens), (tokens, heads, HEAD_DIM), dtype)
        nbytes = 2 * 2 * k.size * k.dtype.itemsize  # K and V, read once and written once
        cells = []
        for name in backends:
            backend = attention_backend_for(name)
            fn = jax.jit(backend.write_kv_cache, donate_argnums=0)
            state = {"cache": in_layout(backend, jnp.zeros((1, num_blocks, block_size, 2 * heads, HEAD_DIM), dtype))}

            def step(fn=fn, state=state, k=k, slots=slots):
                state["cache"] = fn(state["cache"], k, k, slots, layer_index=jnp.int32(0))
                return state["cache"]
            cells.append((name, _measure(step, nbytes, iters)))
        yield f"kv write {tokens} tokens", nbytes, cells


def _measure(fn, nbytes: int, iters: int) -> dict | str:
    """{"us", "gb_s"} from the host's clock, and on an accelerator {"device_us", "device_gb_s", "kernels"}."""
    try:
        us = time_us(fn, iters=iters)
        cell = {"us": us, "gb_s": nbytes / us / 1e3}
        if jax.default_backend() != "cpu":
            timed = device_time(fn, iters)
            if timed is not None:
                cell.update(device_us=timed[0], device_gb_s=nbytes / timed[0] / 1e3 if timed[0] else 0.0,
                            kernels=timed[1])
    except Exception as e:  # noqa: BLE001 - one failing column must not hide the others
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block-size", type=int, default=16, choices=(16, 32))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes: checks the script, measures nothing")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    ns = parser.parse_args()

    platform = jax.default_backend()
    if platform == "cpu" and not ns.smoke:
        print("benchmarks/attention_kernels.py times accelerator kernels; this machine has only a CPU (the Pallas "
              "kernels would run in interpret mode).\nRun it on a TPU or GPU, or pass --smoke to check this script.")
        return
    device = jax.devices()[0]
    native = attention_backend_for("auto", platform).name
    backends = ["xla"] + ([native] if native != "xla" else ["pallas_tpu", "pallas_gpu"] if ns.smoke else [])
    peak = peak_gbs(device)
    print(f"device: {device.device_kind} ({platform}); peak HBM {peak or '?'} GB/s; dtype {ns.dtype}; "
          f"block size {ns.block_size}; heads {Q_HEADS}q/{KV_HEADS}kv x {HEAD_DIM}")
    dtype = jnp.dtype(ns.dtype)
    rows = list(attention_rows(platform, backends, ns.block_size, dtype, ns.iters, ns.smoke))
    rows += list(write_rows(backends, ns.block_size, dtype, ns.iters, ns.smoke))
    print(f"{'shape':<36} {'MB moved':>9}  {'column':<12} {'us':>9} {'GB/s':>7} {'device us':>10} {'GB/s':>7}")
    for name, nbytes, cells in rows:
        for i, (column, result) in enumerate(cells):
            label = name if i == 0 else ""
            size = f"{nbytes / 1e6:9.1f}" if i == 0 else " " * 9
            if isinstance(result, str):
                print(f"{label:<36} {size}  {column:<12} {result}")
                continue
            on_device = (f" {result['device_us']:10.1f} {result['device_gb_s']:7.1f}" if "device_us" in result
                         else " " * 18)
            rate = result.get("device_gb_s", result["gb_s"])
            frac = f" ({100 * rate / peak:.0f}% of peak)" if peak else ""
            print(f"{label:<36} {size}  {column:<12} {result['us']:9.1f} {result['gb_s']:7.1f}{on_device}{frac}"
                  .rstrip())
    if ns.json:
        cells = [dict(shape=name, mb_moved=nbytes / 1e6, column=column,
                      **({"error": result} if isinstance(result, str) else result))
                 for name, nbytes, row in rows for column, result in row]
        with open(ns.json, "w") as f:
            json.dump(dict(device=device.device_kind, peak_gb_s=peak, dtype=ns.dtype, rows=cells), f, indent=1)


if __name__ == "__main__":
    main()

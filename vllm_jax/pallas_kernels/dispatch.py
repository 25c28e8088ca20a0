"""One entry point for attention and the KV write; the backend is chosen by name or by platform.

The model calls `ragged_paged_attention` / `write_kv_cache` and never knows which implementation runs.
`auto` picks the platform's kernel (pallas_tpu on TPU, pallas_gpu on GPU, xla on CPU). A Pallas backend named
explicitly on CPU runs in Pallas interpret mode, so the whole engine can be tested on CPU through a kernel
(slow: meant for tests with tiny models). Asking for the other accelerator's kernel is an error.

`platform` (default: jax's backend) is the chip the program is built for. A CPU host compiling ahead of time for
a TPU or GPU target (vllm_jax.aot) passes `platform="tpu"` / `"gpu"` to get the real kernel, not interpret mode.
The model always passes its config's platform, so nothing it traces reads jax's backend.
"""

from __future__ import annotations

import jax

from vllm_jax.pallas_kernels import (gpu_attention, gpu_mla_attention, kv_write, mla_attention, tpu_attention,
                                     tpu_mla_attention, xla_attention, xla_common)
from vllm_jax.pallas_kernels.kv_quant import check_scales
from vllm_jax.pallas_kernels.tpu_plan import LANES, round_up

BACKENDS = ("xla", "pallas_tpu", "pallas_gpu")
_AUTO = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu", "rocm": "pallas_gpu"}
_NATIVE = {"pallas_tpu": ("tpu",), "pallas_gpu": ("gpu", "cuda", "rocm")}


def resolve_backend(name: str = "auto", platform: str | None = None) -> str:
    """Map `--attention-backend` to an implementation available on `platform` (default: jax's backend)."""
    platform = platform or jax.default_backend()
    if name == "auto":
        return _AUTO.get(platform, "xla")
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of auto, {', '.join(BACKENDS)}; got {name!r}")
    if name != "xla" and platform != "cpu" and platform not in _NATIVE[name]:
        raise ValueError(f"attention_backend {name!r} does not run on {platform}; use 'auto', 'xla' or "
                         f"{_AUTO.get(platform, 'xla')!r}")
    return name


def block_table_width(blocks_per_seq: int, backend: str, platform: str) -> int:
    """The block table's width for a backend (resolved) on `platform`: the Mosaic kernel copies 128-aligned
    windows of a table row, so on a TPU its table is a multiple of 128 wide (a narrower one would be padded at
    every layer call); every other backend takes the blocks of one max_model_len sequence."""
    if backend == "pallas_tpu" and platform == "tpu":
        return round_up(blocks_per_seq, LANES)
    return blocks_per_seq


def _interpret_mode(backend: str, interpret, platform: str | None = None):
    """What to pass as `interpret=`: False on the kernel's own chip, interpret mode on CPU (or when asked).

    TPU kernels on CPU use the generic interpreter with the Mosaic-path loads, which runs inside the scanned,
    jitted model step; tests also run them under pltpu.InterpretParams (simulated DMAs and semaphores).
    """
    platform = platform or jax.default_backend()
    if not interpret and platform != "cpu":
        return False
    if backend == "pallas_tpu" and interpret not in (False, True):
        return interpret  # e.g. an InterpretParams instance
    return True


def ragged_paged_attention(q: jax.Array, kv_cache_layer: jax.Array, block_tables: jax.Array, seq_lens: jax.Array,
                           query_start_loc: jax.Array, num_seqs: jax.Array, *, sm_scale: float,
                           sliding_window: int | jax.Array | None = None, soft_cap: float | None = None,
                           backend: str = "auto", interpret=False,
                           layer_index: jax.Array | int | None = None, platform: str | None = None,
                           kv_head_offset: jax.Array | int | None = None, k_scale: float = 1.0,
                           v_scale: float = 1.0, sinks: jax.Array | None = None) -> jax.Array:
    """Causal ragged attention over a paged KV cache -> [T, num_q_heads, head_dim].

    Beyond the one-layer signature (docs/architecture/04-kv-cache.md, "KV cache layout"): with `layer_index`,
    `kv_cache_layer` may be the whole [num_layers, ...] stack, so a layer-scanned model never slices (copies) a layer
    out of the donated cache. pallas_tpu's cache is lane-dense ([.., block_size, num_kv_heads * P], kv_layout.py), the
    other backends' [.., block_size, 2 * num_kv_heads, head_dim] (kv_layout.uses_lane_dense).
    `interpret`: force Pallas interpret mode (True, or a pltpu.InterpretParams for pallas_tpu).
    `platform`: the target chip's platform when it is not jax's backend (ahead-of-time compilation).
    `kv_head_offset` (Pallas backends, for sharding/kernel_sharding.py): all of q's heads attend that one KV
    head of a cache that holds every KV head.
    `k_scale` / `v_scale` (static floats): the cache holds K / k_scale and V / v_scale (kv_quant; an fp8 cache's
    per-tensor scales, 1.0 by default as in vLLM).
    `sinks` ([num_q_heads] float32, gpt-oss's attention sinks): one learned logit per query head that only adds
    exp(sink - max) to the softmax denominator; None (static) costs nothing.
    """
    backend = resolve_backend(backend, platform)
    check_scales(k_scale, v_scale)
    args = (q, kv_cache_layer, block_tables, seq_lens, query_start_loc, num_seqs)
    kwargs = dict(sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap, layer_index=layer_index,
                  k_scale=k_scale, v_scale=v_scale)
    if sinks is not None:
        if sinks.shape != (q.shape[1],):
            raise ValueError(f"sinks must be [num_q_heads] = [{q.shape[1]}]; got {sinks.shape}")
        kwargs["sinks"] = sinks
    if backend == "xla":
        if kv_head_offset is not None:
            raise ValueError("kv_head_offset is for the Pallas backends (the xla backend is partitioned by GSPMD)")
        return xla_attention.ragged_paged_attention(*args, **kwargs)
    mode = _interpret_mode(backend, interpret, platform)
    if kv_head_offset is not None:
        kwargs["kv_head_offset"] = kv_head_offset
    if backend == "pallas_tpu":
        return tpu_attention.ragged_paged_attention_tpu(*args, **kwargs, interpret=mode)
    return gpu_attention.ragged_paged_attention_gpu(*args, **kwargs, interpret=mode)


def mla_ragged_paged_attention(q_latent: jax.Array, q_rope: jax.Array, kv_cache: jax.Array, block_tables: jax.Array,
                               seq_lens: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array, *,
                               sm_scale: float, layer_index: jax.Array | int | None = None, backend: str = "auto",
                               interpret=False, platform: str | None = None, kv_scale: float = 1.0) -> jax.Array:
    """DeepSeek's MLA over the latent cache -> [T, H, kv_lora_rank] (mla_attention.mla_ragged_paged_attention's
    contract) on the backend's own kernel: the XLA path, tpu_mla_attention or gpu_mla_attention. `kv_scale`: the
    cache holds row / kv_scale (one scale: the row is key and value)."""
    backend = resolve_backend(backend, platform)
    check_scales(kv_scale, kv_scale)
    rank, width = q_latent.shape[-1], kv_cache.shape[-1]
    batch = (block_tables, seq_lens, query_start_loc, num_seqs)
    if backend == "xla":
        return mla_attention.mla_ragged_paged_attention(q_latent, q_rope, kv_cache, *batch, sm_scale=sm_scale,
                                                        layer_index=layer_index, kv_scale=kv_scale)
    mla_attention.check_row(kv_cache, rank, q_rope.shape[-1])
    q = mla_attention.mla_query(q_latent, q_rope, width)
    mode = _interpret_mode(backend, interpret, platform)
    kwargs = dict(kv_lora_rank=rank, sm_scale=sm_scale, layer_index=layer_index, interpret=mode, kv_scale=kv_scale)
    if backend == "pallas_tpu":
        return tpu_mla_attention.mla_attention_tpu(q, kv_cache, *batch, **kwargs)
    return gpu_mla_attention.mla_attention_gpu(q, kv_cache, *batch, qk_rope_head_dim=q_rope.shape[-1], **kwargs)


def write_kv_cache(kv_cache: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array, *,
                   layer_index: jax.Array | int | None = None, backend: str = "auto",
                   interpret=False, platform: str | None = None, k_scale: float = 1.0,
                   v_scale: float = 1.0) -> jax.Array:
    """Write this step's K/V at `slot_mapping` (K/V interleaved on the head axis, or pallas_tpu's lane-dense rows:
    kv_layout.py); the cache is updated in place
    when donated. `platform` as for ragged_paged_attention. The cache receives K / k_scale and V / v_scale in its
    dtype, saturated for fp8 (kv_quant.quantize)."""
    backend = resolve_backend(backend, platform)
    check_scales(k_scale, v_scale)
    scales = dict(k_scale=k_scale, v_scale=v_scale)
    if backend == "xla":
        return xla_common.write_kv_cache(kv_cache, k, v, slot_mapping, layer_index=layer_index, **scales)
    mode = _interpret_mode(backend, interpret, platform)
    write = kv_write.write_kv_cache_tpu if backend == "pallas_tpu" else kv_write.write_kv_cache_gpu
    return write(kv_cache, k, v, slot_mapping, layer_index=layer_index, interpret=mode, **scales)


"""The KV cache's size from what the compiled programs need, not from a guess.

On an accelerator (no `--num-gpu-blocks-override`, no `--kv-cache-memory-bytes`), per device:
`--gpu-memory-utilization` x the device's memory (this engine's share, as in vLLM: what other arrays hold there,
another engine's or a trainer's, must leave that share free, else start-up is refused), minus the engine's own
weights, minus the largest temporaries of the programs (XLA's memory analysis; the donated cache is aliased in
place, so a program needs its temporaries and nothing else besides weights and cache) with a headroom, in whole
blocks. The temporaries come from a probe in two stages (`sized_by_probes`, `probe_temp_bytes`): the largest
bucket's samplers (they read no cache), then its forward compiled over an abstract cache of the size their
temporaries leave, which warm-up takes over; a forward needing more sizes the cache again (a program's temporaries
barely depend on the donated cache's size: seen 330 -> 331 MiB for Llama-3-8B's 8192-token forward at tensor
parallelism 4 on v6e, hence the headroom). The engine (kv_cache.size_kv_cache) and `vllm-jax compile-check`
(aot/engine_programs.py) size the cache with this one rule. A budget that cannot hold one max_model_len request is
refused with the flags to change (`check_capacity`), as vLLM does at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax

from vllm_jax.config import EngineConfig
from vllm_jax.utils import cdiv
from vllm_jax.worker.compilation import CompilationManager, StepShapes, TraceCounter
from vllm_jax.worker.device_step import DeviceStep

GiB = 1 << 30
MiB = 1 << 20


def temp_headroom(temp_bytes: int) -> int:
    """What is kept free for the programs' temporaries: the probe's, plus an eighth, at least 64 MiB more."""
    return temp_bytes + max(temp_bytes // 8, 64 * MiB)


@dataclass(frozen=True)
class KVBudget:
    """One device's memory: what it has, what the engine may use, and where that goes."""

    device_bytes: int
    usable_bytes: int  # gpu_memory_utilization x device_bytes
    weight_bytes: int
    temp_bytes: int  # the largest compiled program's temporaries (the probe's)
    bytes_per_block: int
    num_blocks: int

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def fits(self) -> bool:
        return self.weight_bytes + self.kv_bytes + self.temp_bytes <= self.usable_bytes


def measures_device_memory(config: EngineConfig) -> bool:
    """True when the cache is sized from the device's memory (neither an override nor an explicit budget): the
    runner then probes the programs' temporaries first."""
    cache = config.cache_config
    return cache.num_gpu_blocks_override is None and cache.kv_cache_memory_bytes is None


def kv_budget(config: EngineConfig, device_bytes: int, weight_bytes: int, temp_bytes: int,
              bytes_per_block: int, others_bytes: int = 0, state_bytes: int = 0) -> KVBudget:
    """The cache's blocks for one device of `device_bytes` (see the module docstring; an override or an explicit
    budget wins); ValueError naming the flags when too little is left for one max_model_len request, or when
    what others hold on the device (`others_bytes`: another engine, a trainer) leaves less free than this
    engine's share. `state_bytes`: a hybrid model's state slots (worker/kv_cache.py), taken from the budget before
    the blocks (an explicit --kv-cache-memory-bytes holds them too, as vLLM's does)."""
    cache = config.cache_config
    usable = int(device_bytes * cache.gpu_memory_utilization)
    if measures_device_memory(config) and others_bytes > 0 and usable > device_bytes - others_bytes:
        raise ValueError(
            f"the device's free memory ({(device_bytes - others_bytes) / GiB:.2f} GiB: {others_bytes / GiB:.2f} of "
            f"its {device_bytes / GiB:.1f} GiB are held by other arrays, such as another engine's cache or a "
            f"trainer's state) is less than this engine's share, --gpu-memory-utilization "
            f"({cache.gpu_memory_utilization}) x {device_bytes / GiB:.1f} GiB; lower --gpu-memory-utilization "
            f"or free that memory (an engine holds its cache until it is deleted or put to sleep)")
    if cache.num_gpu_blocks_override is not None:
        blocks = cache.num_gpu_blocks_override
    elif cache.kv_cache_memory_bytes is not None:
        blocks = (cache.kv_cache_memory_bytes - state_bytes) // bytes_per_block
        if blocks < 2:
            states = f" beside the state slots' {state_bytes} bytes" if state_bytes else ""
            raise ValueError(f"--kv-cache-memory-bytes ({cache.kv_cache_memory_bytes}) holds fewer than 2 blocks of "
                             f"{bytes_per_block} bytes{states}; raise it or use a smaller --block-size")
    else:
        budget = usable - weight_bytes - temp_headroom(temp_bytes) - state_bytes
        if budget < 2 * bytes_per_block:
            temps = f" and the compiled programs' temporaries ({temp_bytes / GiB:.2f} GiB)" if temp_bytes else ""
            raise ValueError(
                f"the weights ({weight_bytes / GiB:.2f} GiB per device){temps} leave no room for "
                f"the KV cache in --gpu-memory-utilization ({cache.gpu_memory_utilization}) x "
                f"{device_bytes / GiB:.1f} GiB: raise --tensor-parallel-size or --gpu-memory-utilization, or lower "
                f"--max-num-batched-tokens")
        blocks = budget // bytes_per_block
    check_capacity(config, blocks)
    return KVBudget(device_bytes, usable, weight_bytes, temp_bytes, bytes_per_block, int(blocks))


def check_capacity(config: EngineConfig, num_blocks: int) -> None:
    """vLLM's start-up check: one request of max_model_len tokens must fit in the cache (and the null block)."""
    max_model_len, block_size = config.model_config.max_model_len, config.cache_config.block_size
    needed = cdiv(max_model_len, block_size)
    if needed > num_blocks - 1:
        raise_flags = ("--gpu-memory-utilization or --tensor-parallel-size" if measures_device_memory(config) else
                       "--kv-cache-memory-bytes / --num-gpu-blocks-override")
        raise ValueError(
            f"max_model_len ({max_model_len}) needs {needed} KV blocks of {block_size} tokens but the cache has "
            f"only {num_blocks - 1} usable blocks; lower --max-model-len or raise {raise_flags}")


def sized_by_probes(blocks_for: Callable[[int], int], sampler_temps: Callable[[], int],
                    forward_temps: Callable[[int], int]) -> tuple[int, int]:
    """(blocks, temporaries): the probe's two stages, one rule for the engine and the ahead-of-time check.

    First the largest bucket's samplers, which read no cache (`sampler_temps`); the cache is sized for their
    temporaries (`blocks_for`); then its forward (and the other cache-reading programs) compiled over a cache of
    exactly that size (`forward_temps(blocks)`), which warm-up then takes over instead of compiling it again.
    Only when the forward needs more (under tensor parallelism its temporaries can exceed the samplers', whose
    logits are vocab-sharded) is the cache sized again for those and the forward compiled at the new size: the
    block count is the one a probe of both at the smallest cache gave (a program's temporaries barely depend on
    the donated cache's size), for one forward compile fewer in the common case."""
    samplers = sampler_temps()
    blocks = blocks_for(samplers)
    forward = forward_temps(blocks)
    if forward > samplers:
        blocks = blocks_for(forward)
        forward_temps(blocks)
    return blocks, max(samplers, forward)


def probe_temp_bytes(step: DeviceStep, shapes: StepShapes, *, samplers: bool = True, forwards: bool = True,
                     logits_for: dict[int, jax.ShapeDtypeStruct] | None = None) -> int:
    """The largest temporaries (XLA's memory analysis) of the programs warm-up compiles for `shapes` (the largest
    bucket), compiled by `step`, a DeviceStep over an abstract cache: nothing is allocated. `samplers` /
    `forwards`: its sampling programs / the rest (the forward, the token programs, a multi-step chunk);
    `logits_for`: the forward's logits by sequence bucket, for samplers compiled without the forward (filled
    in by a forward compiled here). The engine's own step adopts what `step` compiled (DeviceStep.adopt)."""
    manager = CompilationManager(step, TraceCounter(), shapes, None)
    for label, make_ready in manager.plan(logits_for):
        if (samplers if label.startswith("sampler") else forwards):
            make_ready()
    chunks = manager.chunks.executables if manager.chunks is not None else []
    return max(program_temp_bytes(p) for p in step.executables + chunks)


def program_temp_bytes(compiled: jax.stages.Compiled) -> int:
    analysis = compiled.memory_analysis()
    return int(getattr(analysis, "temp_size_in_bytes", 0) or 0) if analysis is not None else 0

"""The KV cache's size on an accelerator from what the compiled programs need, not from a guess.

Per device: `--gpu-memory-utilization` x the device's memory, minus the weights, minus the largest temp bytes
of any compiled program (XLA's memory analysis; the donated cache is aliased in place, so a program needs its
temporaries and nothing else besides weights and cache), in whole blocks. `--num-gpu-blocks-override` and
`--kv-cache-memory-bytes` win, as in kv_cache.num_kv_blocks. A budget that cannot hold one max_model_len request
is refused with the flags to change (kv_cache.check_capacity), as at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_jax.config import EngineConfig
from vllm_jax.worker.kv_cache import check_capacity

GiB = 1 << 30


@dataclass(frozen=True)
class KVBudget:
    """One device's memory: what it has, what the engine may use, and where that goes."""

    device_bytes: int
    usable_bytes: int  # gpu_memory_utilization x device_bytes
    weight_bytes: int
    temp_bytes: int  # the largest compiled program's temporaries
    bytes_per_block: int
    num_blocks: int

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def fits(self) -> bool:
        return self.weight_bytes + self.kv_bytes + self.temp_bytes <= self.usable_bytes


def kv_budget(config: EngineConfig, device_bytes: int, weight_bytes: int, temp_bytes: int,
              bytes_per_block: int) -> KVBudget:
    """The cache's blocks for one device of `device_bytes` (see the module docstring); ValueError naming the
    flags when weights and programs leave too little for one max_model_len request."""
    cache = config.cache_config
    usable = int(device_bytes * cache.gpu_memory_utilization)
    if cache.num_gpu_blocks_override is not None:
        blocks = cache.num_gpu_blocks_override
    else:
        budget = cache.kv_cache_memory_bytes
        if budget is None:
            budget = usable - weight_bytes - temp_bytes
        if budget < 2 * bytes_per_block:
            raise ValueError(
                f"the weights ({weight_bytes / GiB:.2f} GiB per device) and the compiled programs' temporaries "
                f"({temp_bytes / GiB:.2f} GiB) leave no room for the KV cache in "
                f"--gpu-memory-utilization ({cache.gpu_memory_utilization}) x {device_bytes / GiB:.1f} GiB: raise "
                f"--tensor-parallel-size or --gpu-memory-utilization, or lower --max-num-batched-tokens")
        blocks = budget // bytes_per_block
    check_capacity(config, blocks)
    return KVBudget(device_bytes, usable, weight_bytes, temp_bytes, bytes_per_block, int(blocks))

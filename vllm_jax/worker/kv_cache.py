"""Sizing and allocating the device KV cache (paged_kv/ does the block accounting, in pure Python).

Layout (docs/architecture.md, "KV cache layout"): one array [num_layers, num_blocks, block_size, 2 * num_kv_heads,
head_dim], K and V interleaved on the head axis. The block count comes from a memory budget:
`--num-gpu-blocks-override` wins; else `--kv-cache-memory-bytes`; else on TPU/GPU `--gpu-memory-utilization` of
device memory minus what is already in use (weights) and an activation reserve. On CPU the budget is always
explicit (1 GiB by default), never a silent huge allocation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.config import EngineConfig
from vllm_jax.model.spec import DecoderSpec
from vllm_jax.utils import cdiv

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCacheShape:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_layers, self.num_blocks, self.block_size, 2 * self.num_kv_heads, self.head_dim)


def size_kv_cache(config: EngineConfig, spec: DecoderSpec, num_shards: int) -> KVCacheShape:
    """The cache's shape from the memory budget, checked (one max_model_len request fits) and logged.

    The budget is per device, like vLLM's: a cache sharded `num_shards` ways puts 1/num_shards of each block on
    each device."""
    mc, block_size = config.model_config, config.cache_config.block_size
    per_block = bytes_per_block(spec.num_layers, block_size, spec.num_kv_heads, spec.head_dim,
                                mc.kv_cache_dtype) // num_shards
    reserve = activation_reserve_bytes(config, spec.hidden_size, spec.intermediate_size, spec.vocab_size)
    num_blocks = num_kv_blocks(config, per_block, reserve)
    check_capacity(config, num_blocks)
    log_capacity(config, num_blocks, per_block)
    return KVCacheShape(spec.num_layers, num_blocks, block_size, spec.num_kv_heads, spec.head_dim, mc.kv_cache_dtype)


def blocks_per_sequence(max_model_len: int, block_size: int) -> int:
    """The block table's width: the blocks of one max_model_len sequence."""
    return cdiv(max_model_len, block_size)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str) -> int:
    return num_layers * block_size * 2 * num_kv_heads * head_dim * jnp.dtype(dtype).itemsize


def activation_reserve_bytes(config: EngineConfig, hidden_size: int, intermediate_size: int, vocab_size: int) -> int:
    """A generous bound on one step's live activations (float32), kept free on TPU/GPU."""
    sched = config.scheduler_config
    per_token = 4 * (6 * hidden_size + 3 * intermediate_size)
    return sched.max_num_batched_tokens * per_token + sched.max_num_seqs * vocab_size * 4 * 3


def num_kv_blocks(config: EngineConfig, per_block: int, activation_reserve: int) -> int:
    cache = config.cache_config
    if cache.num_gpu_blocks_override is not None:
        return cache.num_gpu_blocks_override
    budget = cache.kv_cache_memory_bytes
    if budget is None:
        stats = jax.devices()[0].memory_stats() or {}
        limit = stats.get("bytes_limit")
        if not limit:
            raise ValueError("cannot read device memory to size the KV cache; pass --kv-cache-memory-bytes or "
                             "--num-gpu-blocks-override")
        budget = int(limit * cache.gpu_memory_utilization) - stats.get("bytes_in_use", 0) - activation_reserve
    blocks = budget // per_block
    if blocks < 2:
        raise ValueError(f"the KV cache budget ({budget} bytes) holds fewer than 2 blocks of {per_block} bytes; "
                         "raise --kv-cache-memory-bytes / --gpu-memory-utilization or use a smaller --block-size")
    return int(blocks)


def check_capacity(config: EngineConfig, num_blocks: int) -> None:
    """vLLM's start-up check: one request of max_model_len tokens must fit in the cache."""
    block_size = config.cache_config.block_size
    needed = blocks_per_sequence(config.model_config.max_model_len, block_size)
    if needed > num_blocks - 1:
        raise ValueError(
            f"max_model_len ({config.model_config.max_model_len}) needs {needed} KV blocks of {block_size} tokens "
            f"but the cache has only {num_blocks - 1} usable blocks; lower --max-model-len or raise "
            "--kv-cache-memory-bytes / --num-gpu-blocks-override")


def log_capacity(config: EngineConfig, num_blocks: int, per_block: int) -> None:
    tokens = (num_blocks - 1) * config.cache_config.block_size
    concurrency = tokens / config.model_config.max_model_len
    logger.info("KV cache: %d blocks of %d tokens (%.1f MiB, %d tokens); maximum concurrency for %d-token "
                "requests: %.2fx", num_blocks, config.cache_config.block_size, num_blocks * per_block / 2**20,
                tokens, config.model_config.max_model_len, concurrency)


def allocate_kv_cache(shape: KVCacheShape, sharding: jax.sharding.Sharding | None = None) -> jax.Array:
    """Zeroed cache created on the device (no host copy of the whole array)."""
    make = jax.jit(lambda: jnp.zeros(shape.shape, np.dtype(jnp.dtype(shape.dtype))), out_shardings=sharding)
    return make()

"""Sizing and allocating the device KV cache (paged_kv/ does the block accounting, in pure Python).

Layout (docs/architecture/04-kv-cache.md, "KV cache layout"): one array [num_layers, num_blocks, block_size, 2 *
num_kv_heads, head_dim], K and V interleaved on the head axis (pallas_tpu: [num_layers, num_blocks, block_size,
num_kv_heads * P], lane-dense, pallas_kernels/kv_layout.py); an MLA model (DeepSeek) holds one row of kv_lora_rank +
qk_rope_head_dim per token instead ([..., 1, width]: `DecoderSpec.kv_cache_heads` / `kv_cache_width`). The block
count comes from a memory budget
(worker/kv_budget.py): `--num-gpu-blocks-override` wins; else `--kv-cache-memory-bytes`; else on TPU/GPU
`--gpu-memory-utilization` of device memory (this engine's share, as in vLLM) minus its weights and the compiled
programs' temporaries, measured by a probe compile. On CPU the budget is always explicit (1 GiB by default),
never a silent huge allocation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.config import EngineConfig
from vllm_jax.model.spec import DecoderSpec
from vllm_jax.model.state_cache import HybridCache, StateLayout
from vllm_jax.pallas_kernels.kv_layout import row_lanes
from vllm_jax.utils import cdiv
from vllm_jax.worker.kv_budget import kv_budget, measures_device_memory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCacheShape:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    cache_heads: int | None = None  # rows per token on the head axis; None: 2 * num_kv_heads (K/V interleaved)
    lane_dense: bool = False  # pallas_tpu's [.., block_size, num_kv_heads * P] rows (kv_layout.py)

    @property
    def shape(self) -> tuple[int, ...]:
        if self.lane_dense:
            return (self.num_layers, self.num_blocks, self.block_size, row_lanes(self.num_kv_heads, self.head_dim))
        heads = 2 * self.num_kv_heads if self.cache_heads is None else self.cache_heads
        return (self.num_layers, self.num_blocks, self.block_size, heads, self.head_dim)

    def abstract(self, sharding: jax.sharding.Sharding | None = None) -> jax.ShapeDtypeStruct:
        """The cache as a ShapeDtypeStruct (for compiling without allocating)."""
        return jax.ShapeDtypeStruct(self.shape, jnp.dtype(self.dtype), sharding=sharding)


@dataclass(frozen=True)
class HybridCacheShape:
    """A hybrid model's cache (model/state_cache.py): the attention layers' K/V blocks and `num_slots` state slots
    (docs/architecture/17-state-cache.md, "The state cache")."""

    kv: KVCacheShape
    state: StateLayout
    num_slots: int
    conv_dtype: str

    @property
    def num_blocks(self) -> int:
        return self.kv.num_blocks

    def abstract(self, sharding: HybridCache | None = None) -> HybridCache:
        """The cache as a HybridCache of ShapeDtypeStructs (`sharding`: one per part)."""
        part = (lambda name: None) if sharding is None else (lambda name: getattr(sharding, name))
        state = self.state
        return HybridCache(
            kv=self.kv.abstract(part("kv")),
            conv=jax.ShapeDtypeStruct((state.num_layers, self.num_slots, *state.conv_shape), jnp.dtype(self.conv_dtype),
                                      sharding=part("conv")),
            recurrent=jax.ShapeDtypeStruct((state.num_layers, self.num_slots, *state.recurrent_shape),
                                           jnp.dtype(state.recurrent_dtype), sharding=part("recurrent")))


def num_state_slots(config: EngineConfig) -> int:
    """A hybrid model's state slots: one per request the scheduler may hold, as many again for the snapshots of
    prefix caching when it is on (paged_kv/state_snapshots.py), and the null slot."""
    per_request = 2 if config.cache_config.enable_prefix_caching else 1
    return per_request * config.scheduler_config.max_num_seqs + 1


def state_pool_bytes(config: EngineConfig, spec: DecoderSpec) -> int:
    """The state slots' bytes (0 for a model without recurrent layers), taken from the budget before the blocks."""
    layout = spec.state_layout
    if layout is None:
        return 0
    return num_state_slots(config) * layout.bytes_per_slot(config.model_config.dtype)


def device_memory(device: jax.Device) -> tuple[int, int]:
    """(the bytes `device`'s allocator may hold, the bytes in use on it now: the weights), from jax."""
    stats = device.memory_stats() or {}
    if not stats.get("bytes_limit"):
        raise ValueError("cannot read device memory to size the KV cache; pass --kv-cache-memory-bytes or "
                         "--num-gpu-blocks-override")
    return int(stats["bytes_limit"]), int(stats.get("bytes_in_use", 0))


def size_kv_cache(config: EngineConfig, spec: DecoderSpec, num_shards: int, temp_bytes: int = 0,
                  device: jax.Device | None = None, extra_bytes_per_block: int = 0,
                  read_memory: Callable[[jax.Device], tuple[int, int]] | None = None,
                  own_weight_bytes: int | None = None) -> KVCacheShape:
    """The cache's shape from the memory budget (`temp_bytes`: the programs' largest temporaries, when
    measures_device_memory; `device`: the first of the runner's mesh, default jax's first; `read_memory`: how
    its memory is read, default `device_memory`), checked (one max_model_len request fits) and logged.
    `extra_bytes_per_block`: what a second cache indexed by the same blocks (a draft model's) holds per block on
    one device. `own_weight_bytes`: this engine's weights on that device; the rest of what is in use there
    belongs to others (another engine, a trainer) and only has to leave the engine's share free. None: all of
    it is counted as weights.

    The budget is per device and per engine, like vLLM's: a cache sharded `num_shards` ways puts 1/num_shards
    of each block on each device."""
    mc, block_size = config.model_config, config.cache_config.block_size
    state_bytes = state_pool_bytes(config, spec)
    per_block = (spec_bytes_per_block(spec, block_size, mc.kv_cache_dtype, lane_dense_cache(config, spec)) // num_shards
                 + extra_bytes_per_block)
    device = device or jax.devices()[0]  # a data-parallel replica's own devices, not replica 0's
    read_memory = read_memory or device_memory
    device_bytes, in_use = read_memory(device) if measures_device_memory(config) else (0, 0)
    weight_bytes = in_use if own_weight_bytes is None else min(own_weight_bytes, in_use)
    num_blocks = kv_budget(config, device_bytes, weight_bytes, temp_bytes, per_block,
                           others_bytes=in_use - weight_bytes, state_bytes=state_bytes).num_blocks
    log_capacity(config, num_blocks, per_block)
    if state_bytes:
        logger.info("State cache: %d slots of %.2f MiB (%.1f MiB; one per sequence, whatever its length)",
                    num_state_slots(config), state_bytes / num_state_slots(config) / 2**20, state_bytes / 2**20)
    return cache_shape(config, spec, num_blocks)


def blocks_per_sequence(max_model_len: int, block_size: int) -> int:
    """The block table's width: the blocks of one max_model_len sequence."""
    return cdiv(max_model_len, block_size)


def min_kv_blocks(config: EngineConfig) -> int:
    """The smallest cache the engine starts with: one max_model_len request and the null block."""
    return blocks_per_sequence(config.model_config.max_model_len, config.cache_config.block_size) + 1


def lane_dense_cache(config: EngineConfig, spec: DecoderSpec) -> bool:
    """Whether the engine's K/V cache takes pallas_tpu's lane-dense layout (kv_layout.py): any cache of K/V pairs
    (Gemma 4's too, in its padded width and repeated heads: `kv_cache_heads` / `kv_cache_width`); an MLA latent
    cache (one row per token, `kv_cache_heads` 1) never does."""
    return config.resolved_attention_backend.lane_dense and spec.kv_cache_heads % 2 == 0


def cache_shape(config: EngineConfig, spec: DecoderSpec, num_blocks: int) -> KVCacheShape | HybridCacheShape:
    """The engine's cache: K/V blocks, and a hybrid model's state slots beside them."""
    mc = config.model_config
    # KV heads of the cache (Gemma 4: the most any layer has), each kv_cache_width wide
    pairs = spec.kv_cache_heads // 2 if spec.kv_cache_heads % 2 == 0 else spec.num_kv_heads
    kv = KVCacheShape(spec.num_cache_layers, num_blocks, config.cache_config.block_size, pairs,
                      spec.kv_cache_width, mc.kv_cache_dtype, cache_heads=spec.kv_cache_heads,
                      lane_dense=lane_dense_cache(config, spec))
    if spec.state_layout is None:
        return kv
    return HybridCacheShape(kv, spec.state_layout, num_state_slots(config), mc.dtype)


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str,
                    lane_dense: bool = False) -> int:
    row = row_lanes(num_kv_heads, head_dim) if lane_dense else 2 * num_kv_heads * head_dim
    return num_layers * block_size * row * jnp.dtype(dtype).itemsize


def spec_bytes_per_block(spec: DecoderSpec, block_size: int, dtype: str, lane_dense: bool = False) -> int:
    """One block's bytes (all cache layers, unsharded) in the spec's own layout: K/V rows (`lane_dense`:
    pallas_tpu's padded pair windows, lane_dense_cache), or MLA's latent row; layers that read another layer's
    K/V (Gemma 4's KV sharing) hold none."""
    if lane_dense:
        return bytes_per_block(spec.num_cache_layers, block_size, spec.kv_cache_heads // 2, spec.kv_cache_width,
                               dtype, True)
    return spec.num_cache_layers * block_size * spec.kv_cache_heads * spec.kv_cache_width * jnp.dtype(dtype).itemsize


def log_capacity(config: EngineConfig, num_blocks: int, per_block: int) -> None:
    tokens = (num_blocks - 1) * config.cache_config.block_size
    concurrency = tokens / config.model_config.max_model_len
    logger.info("KV cache: %d blocks of %d tokens (%.1f MiB, %d tokens); maximum concurrency for %d-token "
                "requests: %.2fx", num_blocks, config.cache_config.block_size, num_blocks * per_block / 2**20,
                tokens, config.model_config.max_model_len, concurrency)


def allocate_kv_cache(shape: KVCacheShape | HybridCacheShape,
                      sharding: jax.sharding.Sharding | HybridCache | None = None) -> jax.Array | HybridCache:
    """Zeroed cache created on the device (no host copy of the whole array)."""
    abstract = shape.abstract()
    make = jax.jit(lambda: jax.tree.map(lambda a: jnp.zeros(a.shape, np.dtype(a.dtype)), abstract),
                   out_shardings=sharding)
    return make()

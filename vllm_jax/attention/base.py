"""What every attention backend is: one object, resolved once from `--attention-backend` and the platform
(selector.attention_backend_for), that owns everything which must agree for attention to work:

* the KV cache layout: K/V interleaved on a head axis ([.., block_size, 2 * kv_heads, head_dim]) or pallas_tpu's
  lane-dense rows (pallas_kernels/kv_layout.py), how many KV heads a cache holds and which axis splits its heads;
* the block table's width for a max_model_len sequence;
* the KV write, ragged paged attention (sinks, soft cap and fp8 scales included) and MLA, on its own kernels;
* under tensor parallelism, how those calls run over the mesh: inside shard_map over the KV heads
  (attention/tensor_parallel.py) or as plain XLA ops that GSPMD partitions.

The model calls `write_kv_cache` / `attention` / `mla_attention` with its mesh (None: one device) and never
knows which implementation runs. Objects are frozen and compare by value: they sit in a model's graphdef as
static data, so two resolutions of the same flag give the same program.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from vllm_jax.attention.tensor_parallel import attention as sharded_attention
from vllm_jax.attention.tensor_parallel import mla_attention as sharded_mla_attention
from vllm_jax.attention.tensor_parallel import write_kv_cache as sharded_write_kv_cache
from vllm_jax.pallas_kernels.kv_quant import check_scales
from vllm_jax.sharding.mesh import MODEL_AXIS


@dataclass(frozen=True)
class AttentionBackend(ABC):
    platform: str  # what the program is built for: cpu, tpu or gpu (a Pallas backend on cpu: interpret mode)
    interpret: Any = False  # tests: force Pallas interpret mode (True, or pltpu.InterpretParams for pallas_tpu)

    name: ClassVar[str]  # the --attention-backend value it answers to
    lane_dense: ClassVar[bool] = False  # the KV cache's rows are kv_layout.py's lane-dense pair windows
    shard_mapped: ClassVar[bool] = True  # under a mesh its kernels run in shard_map (False: GSPMD splits them)

    # ---- the KV cache layout and the block table ----------------------------------------------------------

    def cache_kv_heads(self, kv_cache: jax.Array, head_dim: int) -> int:
        """KV heads a K/V cache of this layout holds (any leading dims)."""
        return kv_cache.shape[-2] // 2

    def cache_head_spec(self, ndim: int, axis: str) -> P:
        """The spec splitting a K/V cache's heads over `axis`: whole (k_i, v_i) pairs per shard."""
        return P(*([None] * (ndim - 2)), axis, None)

    def block_table_width(self, blocks_per_seq: int) -> int:
        """The block table's width for sequences of up to `blocks_per_seq` blocks."""
        return blocks_per_seq

    def kernel_names(self, mla: bool) -> tuple[str, ...]:
        """The custom calls a forward built with this backend contains (vllm_jax.aot checks that none fell back
        to XLA ops): none for plain XLA."""
        return ()

    def tensor_parallel_size(self, mesh: Mesh | None) -> int:
        """Devices its kernels are split over by shard_map: 1 without a mesh, or when GSPMD partitions them."""
        if mesh is None or not self.shard_mapped:
            return 1
        return dict(zip(mesh.axis_names, mesh.devices.shape))[MODEL_AXIS]

    # ---- the calls the model makes ------------------------------------------------------------------------

    def write_kv_cache(self, kv_cache: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array, *,
                       layer_index: jax.Array | int | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
                       mesh: Mesh | None = None) -> jax.Array:
        """Write this step's K/V ([T, kv_heads, head_dim]) at `slot_mapping`; the cache is updated in place when
        donated. It receives K / k_scale and V / v_scale in its dtype, saturated for fp8 (kv_quant.quantize)."""
        check_scales(k_scale, v_scale)
        call = functools.partial(self._write_kv_cache, k_scale=k_scale, v_scale=v_scale)
        return self._on(mesh, sharded_write_kv_cache, call, kv_cache, k, v, slot_mapping,
                        layer_index=layer_index)

    def attention(self, q: jax.Array, kv_cache: jax.Array, block_tables: jax.Array, seq_lens: jax.Array,
                  query_start_loc: jax.Array, num_seqs: jax.Array, *, sm_scale: float,
                  sliding_window: int | jax.Array | None = None, soft_cap: float | None = None,
                  layer_index: jax.Array | int | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
                  sinks: jax.Array | None = None, mesh: Mesh | None = None) -> jax.Array:
        """Causal ragged attention over the paged KV cache -> [T, num_q_heads, head_dim].

        With `layer_index`, `kv_cache` may be the whole [num_layers, ...] stack, so a layer-scanned model never
        slices (copies) a layer out of the donated cache. `soft_cap` (Gemma 2): scores -> cap * tanh(scores /
        cap) after sm_scale. `k_scale` / `v_scale` (static): the cache holds K / k_scale and V / v_scale.
        `sinks` ([num_q_heads] float32, gpt-oss): one learned logit per query head that only adds exp(sink -
        max) to the softmax denominator; None (static) costs nothing."""
        check_scales(k_scale, v_scale)
        if sinks is not None and sinks.shape != (q.shape[1],):
            raise ValueError(f"sinks must be [num_q_heads] = [{q.shape[1]}]; got {sinks.shape}")
        call = functools.partial(self._attention, sm_scale=sm_scale, soft_cap=soft_cap, k_scale=k_scale,
                                 v_scale=v_scale)
        return self._on(mesh, sharded_attention, call, q, kv_cache, block_tables, seq_lens,
                        query_start_loc, num_seqs, sliding_window=sliding_window, layer_index=layer_index,
                        sinks=sinks)

    def mla_attention(self, q_latent: jax.Array, q_rope: jax.Array, kv_cache: jax.Array, block_tables: jax.Array,
                      seq_lens: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array, *, sm_scale: float,
                      layer_index: jax.Array | int | None = None, kv_scale: float = 1.0,
                      mesh: Mesh | None = None) -> jax.Array:
        """DeepSeek's MLA over the latent cache -> [T, H, kv_lora_rank] (mla_attention.mla_ragged_paged_attention's
        contract). `kv_scale`: the cache holds row / kv_scale (one scale: the row is key and value)."""
        check_scales(kv_scale, kv_scale)
        call = functools.partial(self._mla_attention, sm_scale=sm_scale, kv_scale=kv_scale)
        return self._on(mesh, sharded_mla_attention, call, q_latent, q_rope, kv_cache, block_tables,
                        seq_lens, query_start_loc, num_seqs, layer_index=layer_index)

    def _on(self, mesh: Mesh | None, sharded: Callable, call: Callable, *args, **kwargs) -> jax.Array:
        """`call` on one device (no mesh, tp 1, or a backend GSPMD partitions), else `sharded`'s shard_map of it."""
        tp = self.tensor_parallel_size(mesh)
        if tp == 1:
            return call(*args, **kwargs)
        return sharded(self, mesh, tp, call, *args, **kwargs)

    # ---- each backend's own kernels (one device's arrays) -------------------------------------------------

    @abstractmethod
    def _write_kv_cache(self, kv_cache, k, v, slot_mapping, *, layer_index, k_scale, v_scale) -> jax.Array: ...

    @abstractmethod
    def _attention(self, q, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, *, sm_scale,
                   sliding_window, soft_cap, layer_index, k_scale, v_scale, sinks,
                   kv_head_offset=None) -> jax.Array:
        """`kv_head_offset` (the shard_map wrapper's replicated layout): all of q's heads attend that one KV head
        of a cache that holds every KV head."""

    @abstractmethod
    def _mla_attention(self, q_latent, q_rope, kv_cache, block_tables, seq_lens, query_start_loc, num_seqs, *,
                       sm_scale, layer_index, kv_scale) -> jax.Array: ...

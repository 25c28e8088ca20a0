"""Writing the step's new K/V into the paged cache, updated in place.

The GPU kernel aliases the cache input to their output (`input_output_aliases`), so under a donated cache XLA
writes into the same buffer and nothing proportional to the cache size is read or copied: only the T new
rows move. K and V are first interleaved on the head axis ([T, 2 * num_kv_heads, head_dim], a copy of the
new rows only, quantized for an fp8 cache: kv_quant.interleave, the xla write's own code), so that one token's
K/V is one contiguous row of a page: `cache[layer, slot // block_size, slot % block_size]`. Padding tokens
carry slots in the null block 0 (the runner's convention) and are written there like any other token; no
sequence reads that block.

* TPU: the cache is lane-dense (kv_layout.py: one token's K/V is one [num_kv_heads * P]-lane row, built by
  kv_layout.interleave_rows) and the write is an XLA scatter of those rows (write_kv_cache_tpu says why).
* GPU (Triton): one program per token stores its [2H, head_dim] row. A head_dim that is not a power of two
  (Phi-3's 96) is stored through a masked `plgpu.store` of the row padded to gpu_attention.padded_head_dim columns:
  the cache keeps its unpadded rows and the columns past head_dim are never written.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vllm_jax.pallas_kernels.costs import kv_write_cost
from vllm_jax.pallas_kernels.gpu_attention import _CompilerParams as _TritonParams
from vllm_jax.pallas_kernels.gpu_attention import _plgpu, padded_head_dim
from vllm_jax.pallas_kernels.kv_layout import interleave_rows
from vllm_jax.pallas_kernels.kv_quant import interleave


def _stacked(kv_cache: jax.Array, layer_index) -> tuple[jax.Array, jax.Array, bool]:
    if layer_index is None:
        return kv_cache[None], jnp.zeros((1,), jnp.int32), True
    return kv_cache, jnp.asarray(layer_index, jnp.int32).reshape(1), False


def write_kv_cache_tpu(kv_cache: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array, *,
                       layer_index: jax.Array | int | None = None, interpret=False, k_scale: float = 1.0,
                       v_scale: float = 1.0) -> jax.Array:
    """Same contract as xla_common.write_kv_cache, into pallas_tpu's lane-dense cache (kv_layout.py): [num_layers,
    num_blocks, block_size, lanes] with `layer_index`, else one layer [num_blocks, block_size, lanes].

    An XLA scatter of whole rows, not a Mosaic kernel: block_size is the second-minor (sublane-tiled) dim of the
    lane-dense cache, and a Mosaic DMA cannot start inside a tile ("Offsets along tiled dimensions must be aligned
    to tiles", seen by `vllm-jax compile-check` for v6e), while XLA writes single rows of a tiled array itself, in
    place on the donated cache (the compile-check's alias bytes). The indices stay (layer, page, offset): merging
    the page and offset dims would not be a bitcast for an fp8 cache (32-row tiles) at block_size 16. `interpret`
    is accepted for the common signature."""
    del interpret
    rows = interleave_rows(k, v, kv_cache.dtype, k_scale, v_scale)
    if rows.shape[1] != kv_cache.shape[-1]:
        raise ValueError(f"pallas_tpu KV write: {k.shape[1]} KV heads of {k.shape[2]} make {rows.shape[1]}-lane "
                         f"rows; the cache's rows have {kv_cache.shape[-1]} lanes")
    block_size = kv_cache.shape[-2]
    slots = slot_mapping.astype(jnp.int32)
    page, offset = slots // block_size, slots % block_size
    if layer_index is None:
        return kv_cache.at[page, offset].set(rows, mode="promise_in_bounds")
    return kv_cache.at[jnp.asarray(layer_index, jnp.int32), page, offset].set(rows, mode="promise_in_bounds")


def _store_columns(ref, index: tuple, value: jax.Array, head_dim: int) -> None:
    """ref[*index, <value's leading dims>, :head_dim] = value ([..., padded] columns): masked past head_dim. One
    index tuple, not chained `.at` views (jax's interpreter cannot discharge a masked store through those)."""
    padded = value.shape[-1]
    lead = (slice(None),) * (value.ndim - 1)
    if padded == head_dim:
        ref[(*index, *lead, slice(None))] = value
        return
    cols = jax.lax.broadcasted_iota(jnp.int32, value.shape, value.ndim - 1)
    _plgpu.store(ref.at[(*index, *lead, pl.ds(0, padded))], value, mask=cols < head_dim)


def _gpu_kernel(slots_ref, layer_ref, new_ref, cache_in, cache_out, *, block_size: int, head_dim: int):
    del cache_in  # aliased to cache_out
    t = pl.program_id(0)
    slot = slots_ref[t]
    page, offset = jax.lax.div(slot, block_size), jax.lax.rem(slot, block_size)
    combined = new_ref.shape[1]
    if combined & (combined - 1) == 0:
        _store_columns(cache_out, (layer_ref[0], page, offset), new_ref[t, :, :], head_dim)
    else:  # Triton blocks are powers of two: store row by row
        for c in range(combined):
            # (an array index: jax's interpreter cannot discharge a masked store at a Python int index)
            _store_columns(cache_out, (layer_ref[0], page, offset, jnp.int32(c)), new_ref[t, c, :], head_dim)


def write_kv_cache_gpu(kv_cache: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array, *,
                       layer_index: jax.Array | int | None = None, interpret: bool = False, k_scale: float = 1.0,
                       v_scale: float = 1.0) -> jax.Array:
    """Same contract as xla_common.write_kv_cache, as a Triton kernel (any head_dim: the new rows are padded to
    padded_head_dim columns, a copy of T rows, and stored masked)."""
    cache, layer, squeeze = _stacked(kv_cache, layer_index)
    head_dim = cache.shape[-1]
    new = interleave(k, v, cache.dtype, k_scale, v_scale)
    new = jnp.pad(new, ((0, 0), (0, 0), (0, padded_head_dim(head_dim) - head_dim)))
    whole = pl.BlockSpec()
    out = pl.pallas_call(
        functools.partial(_gpu_kernel, block_size=cache.shape[2], head_dim=head_dim),
        grid=(new.shape[0],),
        in_specs=[whole] * 4,
        out_specs=whole,
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        input_output_aliases={3: 0},
        compiler_params=_TritonParams(num_warps=1, num_stages=1),
        cost_estimate=kv_write_cost(num_tokens=new.shape[0], combined=new.shape[1], head_dim=head_dim,
                                    dtype=cache.dtype),
        interpret=interpret,
        name="vllm_jax_write_kv_cache",
    )(slot_mapping.astype(jnp.int32), layer, new, cache)
    return out[0] if squeeze else out

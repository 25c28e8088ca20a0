"""Writing the step's new K/V into the paged cache, as Pallas kernels that update the cache in place.

Both kernels alias the cache input to their output (`input_output_aliases`), so under a donated cache XLA
writes into the same buffer and nothing proportional to the cache size is read or copied: only the T new
rows move. K and V are first interleaved on the head axis ([T, 2 * num_kv_heads, head_dim], a copy of the
new rows only, quantized for an fp8 cache: kv_quant.interleave, the xla write's own code), so that one token's
K/V is one contiguous row of a page: `cache[layer, slot // block_size, slot % block_size]`. Padding tokens
carry slots in the null block 0 (the runner's convention) and are written there like any other token; no
sequence reads that block.

* TPU: slot_mapping and the layer index are scalar-prefetched into SMEM; each grid step issues one HBM -> HBM
  DMA per token of its chunk, then waits for all of them.
* GPU (Triton): one program per token stores its [2H, head_dim] row.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from vllm_jax.pallas_kernels.costs import kv_write_cost
from vllm_jax.pallas_kernels.gpu_attention import _CompilerParams as _TritonParams
from vllm_jax.pallas_kernels.kv_quant import interleave
from vllm_jax.pallas_kernels.tpu_attention import _ANY, _CompilerParams as _MosaicParams

_TPU_CHUNK = 128  # tokens whose DMAs are in flight together


def _stacked(kv_cache: jax.Array, layer_index) -> tuple[jax.Array, jax.Array, bool]:
    if layer_index is None:
        return kv_cache[None], jnp.zeros((1,), jnp.int32), True
    return kv_cache, jnp.asarray(layer_index, jnp.int32).reshape(1), False


def _tpu_kernel(slots_ref, layer_ref, new_hbm, cache_in, cache_out, sem, *, chunk: int, num_tokens: int,
                block_size: int):
    del cache_in  # aliased to cache_out
    base = pl.program_id(0) * chunk
    layer = layer_ref[0]

    def each_token(action):
        def body(t, carry):
            @pl.when(base + t < num_tokens)
            def _():
                slot = slots_ref[base + t]
                page, offset = jax.lax.div(slot, block_size), jax.lax.rem(slot, block_size)
                copy = pltpu.make_async_copy(new_hbm.at[base + t], cache_out.at[layer, page, offset], sem)
                if action == "start":
                    copy.start()
                else:
                    copy.wait()
            return carry
        jax.lax.fori_loop(0, chunk, body, 0)

    each_token("start")
    each_token("wait")


def write_kv_cache_tpu(kv_cache: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array, *,
                       layer_index: jax.Array | int | None = None, interpret=False, k_scale: float = 1.0,
                       v_scale: float = 1.0) -> jax.Array:
    """Same contract as xla_common.write_kv_cache, as a Mosaic kernel."""
    from vllm_jax.pallas_kernels.chips import CHIPS, current_chip

    cache, layer, squeeze = _stacked(kv_cache, layer_index)
    new = interleave(k, v, cache.dtype, k_scale, v_scale)
    num_tokens = new.shape[0]
    chip = current_chip()
    chip = chip if chip is not None and chip.platform == "tpu" else CHIPS["v5e"]
    if 4 * num_tokens > chip.smem_bytes // 2:  # slot_mapping is scalar-prefetched whole
        raise ValueError(f"pallas_tpu KV write: {num_tokens} slots ({4 * num_tokens // 1024} KiB) exceed half of "
                         f"{chip.name}'s {chip.smem_bytes // 1024} KiB SMEM: lower --max-num-batched-tokens")
    chunk = min(_TPU_CHUNK, num_tokens)
    kernel = functools.partial(_tpu_kernel, chunk=chunk, num_tokens=num_tokens, block_size=cache.shape[2])
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(-(-num_tokens // chunk),),
            in_specs=[pl.BlockSpec(memory_space=_ANY), pl.BlockSpec(memory_space=_ANY)],
            out_specs=pl.BlockSpec(memory_space=_ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA(())]),
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        input_output_aliases={3: 0},  # (slots, layer, new, cache) -> cache
        compiler_params=_MosaicParams(dimension_semantics=("parallel",)),
        cost_estimate=kv_write_cost(num_tokens=num_tokens, combined=new.shape[1], head_dim=new.shape[2],
                                    dtype=cache.dtype),
        interpret=interpret,
        name="vllm_jax_write_kv_cache",
    )(slot_mapping.astype(jnp.int32), layer, new, cache)
    return out[0] if squeeze else out


def _gpu_kernel(slots_ref, layer_ref, new_ref, cache_in, cache_out, *, block_size: int):
    del cache_in  # aliased to cache_out
    t = pl.program_id(0)
    slot = slots_ref[t]
    page, offset = jax.lax.div(slot, block_size), jax.lax.rem(slot, block_size)
    combined = new_ref.shape[1]
    if combined & (combined - 1) == 0:
        cache_out[layer_ref[0], page, offset, :, :] = new_ref[t, :, :]
    else:  # Triton blocks are powers of two: store row by row
        for c in range(combined):
            cache_out[layer_ref[0], page, offset, c, :] = new_ref[t, c, :]


def write_kv_cache_gpu(kv_cache: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array, *,
                       layer_index: jax.Array | int | None = None, interpret: bool = False, k_scale: float = 1.0,
                       v_scale: float = 1.0) -> jax.Array:
    """Same contract as xla_common.write_kv_cache, as a Triton kernel (head_dim a power of two)."""
    cache, layer, squeeze = _stacked(kv_cache, layer_index)
    head_dim = cache.shape[-1]
    if head_dim & (head_dim - 1):
        raise ValueError(f"pallas_gpu needs a power-of-two head_dim; got {head_dim}")
    new = interleave(k, v, cache.dtype, k_scale, v_scale)
    whole = pl.BlockSpec()
    out = pl.pallas_call(
        functools.partial(_gpu_kernel, block_size=cache.shape[2]),
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

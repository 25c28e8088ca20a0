"""DeepSeek MLA (absorbed form) as a Mosaic TPU kernel: every query head of a token against the one shared latent
row per cached token (docs/architecture/12-families.md, "DeepSeek MLA").

The contract is mla_attention.mla_ragged_paged_attention's: q is [q_latent | q_rope | zeros] ([T, H, width]), the
cache row [c (kv_lora_rank) | k_rope | zeros] is the key, its first kv_lora_rank entries the value, and the
result is [T, H, kv_lora_rank]. MLA is MQA with one KV head, so the work is cut as tpu_attention.py cuts it with
the GQA group = all H heads: one grid step owns a tile of `tq` tokens (rows = tq * H, row = t * H + h), walks the
sequences whose rows fall in it and, for each, only the pages those rows can see, `pages_per_block` pages at a
time, double-buffered by async DMA (pages, and the 128-aligned windows of the block-table row that name them, one
page block ahead). Softmax is online in float32 VMEM scratch.

Layout. The cache is [L, blocks, block_size, 1, width]; XLA:TPU lays a size-1 second-minor axis out as a major
one, so the kernel takes it reshaped to [L, blocks, block_size, width] (a bitcast: compile-check shows no copy),
and one page is a dense [block_size, width] DMA. Taking the 5-D array as it is made XLA copy the whole cache to a
(2, 128)-tiled layout at every call. The value is the row's first round_up(kv_lora_rank, 128) lanes (DeepSeek's
512: a lane-aligned slice, no copy); the output keeps those lanes and the caller drops any past kv_lora_rank.

fp8: pages are cast to q's dtype through float32 in VMEM (exact), and the row's one scale is folded as kv_quant
describes: into the score scale and into the normalized output.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from vllm_jax.pallas_kernels.costs import attention_cost
from vllm_jax.pallas_kernels.kv_quant import is_fp8
from vllm_jax.pallas_kernels.tpu_attention import _ANY, MASKED, _CompilerParams, _div, tile_sequence_ranges
from vllm_jax.pallas_kernels.tpu_plan import LANES, round_up, sublane_packing, table_window

_TARGET_ROWS = 256  # query rows (tokens x heads) per MXU pass
_KV_BUFFER_BYTES = 512 * 1024  # one page buffer's bytes (two live at once)


@dataclasses.dataclass(frozen=True)
class MlaTpuPlan:
    """Block sizes and the VMEM limit of one MLA call on one chip."""

    tq: int  # tokens per grid step (rows = tq * heads)
    pages_per_block: int
    vmem_estimate_bytes: int
    vmem_limit_bytes: int
    chip: str


def mla_vmem_estimate(*, tq: int, heads: int, pages_per_block: int, block_size: int, width: int, value_width: int,
                      q_dtype, kv_dtype) -> int:
    """VMEM bytes of one grid step: the pipelined q and output blocks (two buffers each), the two page buffers,
    the softmax state and the temporaries of one page block (scores, probabilities, mask; the page cast to q's
    dtype; p @ V), each padded to the (sublane, 128-lane) tiling."""
    rows = tq * heads
    qi, ki = jnp.dtype(q_dtype).itemsize, jnp.dtype(kv_dtype).itemsize
    block_tokens = pages_per_block * block_size
    rows_q = round_up(rows, 8 * sublane_packing(q_dtype))
    qo = 2 * rows_q * (width + value_width) * qi
    kv = 2 * round_up(block_tokens, 8 * sublane_packing(kv_dtype)) * width * ki
    rows32 = round_up(rows, 8)
    state = rows32 * (2 * LANES + value_width) * 4
    temps = (4 * rows32 * round_up(block_tokens, LANES) * 4 + 2 * block_tokens * width * 4
             + 2 * rows32 * value_width * 4)
    return qo + kv + state + temps


def mla_tpu_plan(*, num_tokens: int, heads: int, block_size: int, width: int, value_width: int, q_dtype, kv_dtype,
                 table_width: int, chip=None, tq: int | None = None,
                 pages_per_block: int | None = None) -> MlaTpuPlan:
    """tq: about _TARGET_ROWS rows, a power of two whose rows fill the sublane tiling, at most the padded batch;
    pages: enough to fill _KV_BUFFER_BYTES (at most 32 DMAs and the table width). Then halve the page block and
    the tile until the estimate fits half of the limit (3/4 of the core's VMEM); refused with the flags to change
    when nothing fits."""
    from vllm_jax.pallas_kernels.chips import CHIPS, current_chip

    chip = chip or current_chip()
    if chip is None or chip.platform != "tpu":
        chip = CHIPS["v5e"]  # CPU (interpret mode) or an unlisted TPU: the smallest scoped budget we know
    limit = chip.vmem_bytes * 3 // 4
    tiling = 8 * sublane_packing(q_dtype)
    auto_tq = 1 << (max(1, _TARGET_ROWS // heads).bit_length() - 1)
    auto_tq = min(auto_tq, 1 << max(0, (num_tokens - 1).bit_length()))
    page_bytes = block_size * width * jnp.dtype(kv_dtype).itemsize
    auto_pages = max(1, min(_KV_BUFFER_BYTES // page_bytes, 32, table_width))
    fixed_tq, fixed_pages = tq is not None, pages_per_block is not None
    tq, pages = tq or auto_tq, pages_per_block or auto_pages
    while (tq * heads) % tiling:
        tq *= 2

    def estimate(tq, pages):
        return mla_vmem_estimate(tq=tq, heads=heads, pages_per_block=pages, block_size=block_size, width=width,
                                 value_width=value_width, q_dtype=q_dtype, kv_dtype=kv_dtype)

    while estimate(tq, pages) > limit // 2:
        if pages > 1 and not fixed_pages:
            pages //= 2
        elif tq > 1 and (tq // 2 * heads) % tiling == 0 and not fixed_tq:
            tq //= 2
        else:
            raise ValueError(
                f"pallas_tpu MLA attention does not fit {chip.name}'s VMEM: {estimate(tq, pages) / 2**20:.1f} MiB "
                f"for {tq} token(s) x {heads} heads and {pages} page(s) of {page_bytes // 1024} KiB (budget "
                f"{limit // 2 / 2**20:.0f} MiB); lower --block-size or shard the heads with --tensor-parallel-size")
    return MlaTpuPlan(tq=tq, pages_per_block=pages, vmem_estimate_bytes=estimate(tq, pages), vmem_limit_bytes=limit,
                      chip=chip.name)


def _kernel(first_ref, last_ref, qsl_ref, lens_ref, params_ref,  # scalar prefetch (SMEM)
            q_ref, kv_hbm, tables_hbm,  # q: [rows, width] VMEM block; the cache and the tables stay in HBM
            o_ref, kv_buf, sems, table_buf, table_sems, m_ref, l_ref, acc_ref, *,
            tq: int, heads: int, block_size: int, pages_per_block: int, table_window: int, sm_scale: float,
            out_scale: float):
    rows, value_width = o_ref.shape
    table_width = tables_hbm.shape[1]
    block_tokens = pages_per_block * block_size
    tile = pl.program_id(0)
    t0 = tile * tq
    layer = params_ref[0]

    def span(s):
        """Query rows of sequence s in this tile and the pages they can see (all from position 0: causal)."""
        qs, qe = qsl_ref[s], qsl_ref[s + 1]
        ctx = lens_ref[s] - (qe - qs)
        r0, r1 = jnp.maximum(qs, t0), jnp.minimum(qe, t0 + tq)
        pos_hi = ctx + (r1 - 1 - qs)
        num_pages = jnp.where(r1 > r0, _div(pos_hi, block_size) + 1, 0)
        num_blocks = jnp.maximum(_div(num_pages + pages_per_block - 1, pages_per_block), 1)
        return qs, ctx, r0, r1, pos_hi, num_pages - 1, num_blocks

    def advance(s, j):
        last_block = j + 1 >= span(s)[-1]
        return jnp.where(last_block, s + 1, s), jnp.where(last_block, 0, j + 1)

    def window_start(s, j):
        """First column of the 128-aligned table window that holds page block j (see tpu_attention.py)."""
        start = jnp.minimum(_div(j * pages_per_block, 128) * 128, table_width - table_window)
        return pl.multiple_of(start, 128)

    def table_copy(s, j, slot):
        return pltpu.make_async_copy(tables_hbm.at[s, pl.ds(window_start(s, j), table_window)],
                                     table_buf.at[slot], table_sems.at[slot])

    def page_copies(s, j, slot, action):
        """Start or wait for the page DMAs of block j of sequence s (the same predicate both times)."""
        last_page = span(s)[5]
        start = window_start(s, j) if action == "start" else 0
        for i in range(pages_per_block):
            idx = j * pages_per_block + i

            @pl.when(idx <= last_page)
            def _(idx=idx, i=i):  # pl.when calls it at once, with this iteration's page
                page = table_buf[slot, idx - start] if action == "start" else 0
                copy = pltpu.make_async_copy(kv_hbm.at[layer, page],
                                             kv_buf.at[slot, pl.ds(i * block_size, block_size)], sems.at[slot])
                if action == "start":
                    copy.start()
                else:
                    copy.wait()

    m_ref[...] = jnp.full(m_ref.shape, MASKED, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
    first, last = first_ref[tile], last_ref[tile]

    @pl.when(first <= last)
    def _():
        copy = table_copy(first, 0, 0)
        copy.start()
        copy.wait()
        page_copies(first, 0, 0, "start")
        s1, j1 = advance(first, 0)

        @pl.when(s1 <= last)
        def _():
            table_copy(s1, j1, 1).start()

    def attend(s, j, slot):
        qs, ctx, r0, r1, pos_hi, _, _ = span(s)
        start = j * block_tokens
        token = t0 + _div(jax.lax.broadcasted_iota(jnp.int32, (rows, block_tokens), 0), heads)
        q_pos = ctx + token - qs
        k_pos = start + jax.lax.broadcasted_iota(jnp.int32, (rows, block_tokens), 1)
        mask = (token >= r0) & (token < r1) & (k_pos <= q_pos)
        # Unfetched or stale rows of the buffer may hold anything (NaN): keep them out of p @ V.
        v_ok = start + jax.lax.broadcasted_iota(jnp.int32, (block_tokens, 1), 0) <= pos_hi
        k = kv_buf[slot]
        q = q_ref[...]
        if is_fp8(k.dtype):
            k = k.astype(jnp.float32).astype(q.dtype)
        elif k.dtype != q.dtype:
            k, q = k.astype(jnp.float32), q.astype(jnp.float32)
        precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
        scores = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                                     preferred_element_type=jnp.float32) * sm_scale
        scores = jnp.where(mask, scores, MASKED)
        m_prev, l_prev = m_ref[:, :1], l_ref[:, :1]
        m_new = jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.where(mask, jnp.exp(scores - m_new), 0.0)
        v = k[:, :value_width]
        v = jnp.where(v_ok, v, jnp.zeros_like(v))
        pv = jnp.dot(p.astype(v.dtype), v, precision=precision, preferred_element_type=jnp.float32)
        acc_ref[...] = acc_ref[...] * alpha + pv
        l_ref[...] = jnp.broadcast_to(l_prev * alpha + jnp.sum(p, axis=1, keepdims=True), (rows, LANES))
        m_ref[...] = jnp.broadcast_to(m_new, (rows, LANES))

    def step(carry):
        s, j, slot = carry
        next_s, next_j = advance(s, j)

        @pl.when(next_s <= last)
        def _():
            table_copy(next_s, next_j, 1 - slot).wait()
            page_copies(next_s, next_j, 1 - slot, "start")
            after_s, after_j = advance(next_s, next_j)

            @pl.when(after_s <= last)
            def _():
                table_copy(after_s, after_j, slot).start()

        page_copies(s, j, slot, "wait")
        attend(s, j, slot)
        return next_s, next_j, 1 - slot

    jax.lax.while_loop(lambda c: c[0] <= last, step, (first, jnp.int32(0), jnp.int32(0)))
    out = acc_ref[...] / jnp.maximum(l_ref[:, :1], 1e-30)
    o_ref[...] = (out * out_scale if out_scale != 1.0 else out).astype(o_ref.dtype)


def mla_attention_tpu(q: jax.Array, kv_cache: jax.Array, block_tables: jax.Array, seq_lens: jax.Array,
                      query_start_loc: jax.Array, num_seqs: jax.Array, *, kv_lora_rank: int, sm_scale: float,
                      layer_index: jax.Array | int | None = None, interpret=False, kv_scale: float = 1.0,
                      tq: int | None = None, pages_per_block: int | None = None, chip=None) -> jax.Array:
    """q [T, H, width] = [q_latent | q_rope | zeros]; `kv_cache` one layer [blocks, block_size, 1, width] or the
    stack with `layer_index`; -> [T, H, kv_lora_rank] in q's dtype. `kv_scale`: the cache holds row / kv_scale.
    `tq` / `pages_per_block` / `chip` override the plan (tests)."""
    num_tokens, heads, width = q.shape
    if layer_index is None:
        kv_cache, layer_index = kv_cache[None], 0
    num_layers, num_pages, block_size, _, _ = kv_cache.shape
    kv_rows = kv_cache.reshape(num_layers, num_pages, block_size, width)  # a bitcast on TPU (module docstring)
    value_width = min(round_up(kv_lora_rank, LANES), width)
    num_slots, table_width = block_tables.shape
    plan = mla_tpu_plan(num_tokens=num_tokens, heads=heads, block_size=block_size, width=width,
                        value_width=value_width, q_dtype=q.dtype, kv_dtype=kv_cache.dtype, table_width=table_width,
                        chip=chip, tq=tq, pages_per_block=pages_per_block)
    tq, pages_per_block = plan.tq, plan.pages_per_block
    num_tiles = -(-num_tokens // tq)
    padded = num_tiles * tq
    rows = tq * heads
    q_rows = jnp.pad(q, ((0, padded - num_tokens), (0, 0), (0, 0))).reshape(padded * heads, width)
    first, last = tile_sequence_ranges(query_start_loc, num_seqs, num_tiles, tq)
    params = jnp.asarray(layer_index, jnp.int32).reshape(1)
    prefetch = (first, last, query_start_loc.astype(jnp.int32), seq_lens.astype(jnp.int32), params)
    tables = block_tables.astype(jnp.int32)
    if table_width % 128:  # 128-aligned windows of a row are copied (the table's HBM tiling)
        tables = jnp.pad(tables, ((0, 0), (0, round_up(table_width, 128) - table_width)))
    window_cols = table_window(tables.shape[1], pages_per_block)
    block_tokens = pages_per_block * block_size
    kernel = functools.partial(_kernel, tq=tq, heads=heads, block_size=block_size, pages_per_block=pages_per_block,
                               table_window=window_cols, sm_scale=float(sm_scale) * float(kv_scale),
                               out_scale=float(kv_scale))
    cost = attention_cost(num_tokens=num_tokens, num_seqs=num_slots, num_q_heads=heads, cache_kv_heads=1,
                          head_dim=width, block_size=block_size, table_width=table_width, num_pages=num_pages,
                          q_dtype=q.dtype, kv_dtype=kv_cache.dtype, tile_tokens=tq)
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch), grid=(num_tiles,),
            in_specs=[pl.BlockSpec((rows, width), lambda i, *_: (i, 0)), pl.BlockSpec(memory_space=_ANY),
                      pl.BlockSpec(memory_space=_ANY)],
            out_specs=pl.BlockSpec((rows, value_width), lambda i, *_: (i, 0)),
            scratch_shapes=[
                pltpu.VMEM((2, block_tokens, width), kv_cache.dtype),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SMEM((2, window_cols), jnp.int32),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.VMEM((rows, LANES), jnp.float32),
                pltpu.VMEM((rows, LANES), jnp.float32),
                pltpu.VMEM((rows, value_width), jnp.float32),
            ]),
        out_shape=jax.ShapeDtypeStruct((padded * heads, value_width), q.dtype),
        compiler_params=_CompilerParams(dimension_semantics=("parallel",), vmem_limit_bytes=plan.vmem_limit_bytes),
        cost_estimate=cost,
        interpret=interpret,
        name="vllm_jax_mla_attention",
    )(*prefetch, q_rows, kv_rows, tables)
    return out.reshape(padded, heads, value_width)[:num_tokens, :, :kv_lora_rank]

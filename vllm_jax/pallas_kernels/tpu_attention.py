"""Ragged paged attention as a Mosaic TPU kernel (Pallas).

How the work is cut. The token axis is split into tiles of `tq` tokens; one grid step owns one tile and every
KV head, so each KV page is copied once per tile and serves all heads. Inside a step the kernel walks the
sequences whose query rows fall in the tile and, for each, only the pages those rows can see (from the
sliding-window start of the first row to the causal end of the last), `pages_per_block` pages at a time.
Pages are copied HBM -> VMEM by async DMA into one of two buffers while the other is being read; the
prefetch runs across page blocks and across sequence boundaries. Softmax is online, in float32 VMEM scratch.
Grid steps share no state, so the grid axis is "parallel" (megacore chips split it across cores).

Scalars (tile -> first/last sequence, query_start_loc, seq_lens, the layer index, the traced sliding window
and KV-head offset) are scalar-prefetched into SMEM. The block table is not: at 131072 tokens of context and
256 sequences it is 8 MiB (block 16) and SMEM holds 1 MiB. It stays in HBM, and for each page block the kernel
DMAs the window of the sequence's table row holding that block's page ids (128-aligned, at most 256 int32)
into one of two SMEM slots, one page block ahead of the page DMAs that need it (two ahead of the compute). The
cache stays in HBM (memory space ANY) and is read only through DMAs of whole pages `cache[layer, page]`, so the
stacked form never copies a layer.

Block sizes and the VMEM limit come from the chip (`tpu_plan.py`): the shape rule's tile and page block, shrunk
until the estimated VMEM of a grid step fits half of the `vmem_limit_bytes` set on the kernel (3/4 of the
core's VMEM; the compiler's default scoped limit is 16 MiB on v5e, 32 MiB on v6e). A configuration that cannot
fit is refused with a ValueError naming the flag to change. Each call carries a pl.CostEstimate.

GQA: queries are regrouped outside the kernel to [num_kv_heads, tokens * group, head_dim] (row = t * group + g),
so one KV head's query rows are a single 2-D [tq * group, head_dim] operand for the MXU.

The cache is lane-dense (kv_layout.py): a page is [block_size, num_kv_heads * P] and KV head c owns the
128-aligned lanes [c * P, (c + 1) * P), K first, then V (P = kv_layout.pair_lanes(head_dim)). The page buffer keeps
the page axis ([2, pages, block_size, lanes]) so each DMA lands on whole sublane tiles, whatever the dtype. A
head's window is an aligned lane slice: for head_dim a multiple of 128 K and V are its two halves; otherwise q is
placed in the K lanes of a zero row of P lanes (outside the kernel), so q . window = q . k and p @ window carries
p @ v in the V lanes, sliced out after the call (2x the MXU work of the exact product for head_dim 64, on a
memory-bound kernel; docs/architecture/04-kv-cache.md, "KV cache layout").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from vllm_jax.pallas_kernels.costs import attention_cost
from vllm_jax.pallas_kernels.kv_layout import cache_kv_heads as kv_cache_heads_of
from vllm_jax.pallas_kernels.kv_layout import pair_lanes
from vllm_jax.pallas_kernels.kv_quant import is_fp8
from vllm_jax.pallas_kernels.tpu_plan import LANES, round_up, sublane_packing, table_window, tpu_plan

MASKED = -1e30  # finite: rows that see nothing stay finite (exp(MASKED - MASKED) is never taken unmasked)
_ANY = getattr(pl, "ANY", None) or getattr(pltpu, "ANY", None) or pltpu.TPUMemorySpace.ANY
_CompilerParams = getattr(pltpu, "CompilerParams", None) or pltpu.TPUCompilerParams


def _div(x: jax.Array, d: int) -> jax.Array:
    """Truncating division of non-negative int32 values (Mosaic lowers `//` through sign ops)."""
    return jax.lax.div(x, jnp.full_like(x, d))


def _load_pair(kv_buf, slot, c: int, pair: int, q_dtype) -> jax.Array:
    """KV head c's lane window of the page buffer as [pages * block_size, pair] in the dtype the dots use: q's
    for an fp8 cache (exact, through float32: Mosaic's fp8 casts go via it), float32 when the cache and q differ."""
    w = kv_buf[slot, :, :, pl.ds(c * pair, pair)]
    pages, block_size, _ = w.shape
    if is_fp8(w.dtype) or w.dtype != q_dtype or block_size % (8 * sublane_packing(w.dtype)):
        w = w.astype(jnp.float32)  # merging (pages, block_size) is free on whole float32 sublane tiles
    w = w.reshape(pages * block_size, pair)
    if is_fp8(kv_buf.dtype):
        return w.astype(q_dtype)
    return w.astype(q_dtype) if kv_buf.dtype == q_dtype else w


def _kernel(first_ref, last_ref, qsl_ref, lens_ref, params_ref,  # scalar prefetch (SMEM)
            q_ref, kv_hbm, tables_hbm,  # q: [H, tq * group, D] VMEM block; kv_hbm, tables_hbm: HBM
            *refs,  # (sinks_ref: [Hq] float32 SMEM, with sinks only), o_ref, then the scratch
            tq: int, group: int, block_size: int, pages_per_block: int, table_window: int,
            sm_scale: float, soft_cap: float | None, head_dim: int, pair: int, select_kv_head: bool,
            v_scale: float, has_sinks: bool):
    sinks_ref = refs[0] if has_sinks else None
    o_ref, kv_buf, sems, table_buf, table_sems, m_ref, l_ref, acc_ref = refs[1:] if has_sinks else refs
    num_kv_heads, rows, _ = q_ref.shape
    cache_kv_heads = kv_buf.shape[3] // pair
    table_width = tables_hbm.shape[1]
    block_tokens = pages_per_block * block_size
    tile = pl.program_id(0)
    t0 = tile * tq
    layer, window, kv_offset = params_ref[0], params_ref[1], params_ref[2]

    def span(s):
        """Query rows of sequence s in this tile and the pages they can see."""
        qs, qe = qsl_ref[s], qsl_ref[s + 1]
        ctx = lens_ref[s] - (qe - qs)
        r0, r1 = jnp.maximum(qs, t0), jnp.minimum(qe, t0 + tq)
        pos_hi = ctx + (r1 - 1 - qs)
        k_lo = jnp.where(window > 0, jnp.maximum(ctx + (r0 - qs) - window + 1, 0), 0)
        first_page, last_page = _div(k_lo, block_size), _div(pos_hi, block_size)
        num_pages = jnp.where(r1 > r0, last_page - first_page + 1, 0)
        num_blocks = jnp.maximum(_div(num_pages + pages_per_block - 1, pages_per_block), 1)
        return qs, ctx, r0, r1, pos_hi, first_page, first_page + num_pages - 1, num_blocks

    def advance(s, j):
        """The (sequence, page block) after (s, j) in this tile's walk."""
        last_block = j + 1 >= span(s)[-1]
        return jnp.where(last_block, s + 1, s), jnp.where(last_block, 0, j + 1)

    def window_start(s, j):
        """First table column of the window holding page block j of sequence s: 128-aligned (the HBM tiling
        of the table) and inside the row; the window is 128 + pages_per_block columns or more, so it holds
        the block wherever the block starts."""
        p0 = span(s)[5] + j * pages_per_block
        start = jnp.minimum(_div(p0, 128) * 128, table_width - table_window)
        return pl.multiple_of(start, 128)

    def table_copy(s, j, slot):
        """DMA of the block table window of page block j of sequence s into SMEM slot `slot`."""
        return pltpu.make_async_copy(tables_hbm.at[s, pl.ds(window_start(s, j), table_window)],
                                     table_buf.at[slot], table_sems.at[slot])

    def page_copies(s, j, slot, action):
        """Start or wait for the DMAs of page block j of sequence s (the same predicate both times). Starting
        reads the page ids from the block's table window, already in SMEM slot `slot`; a wait only needs the
        semaphore and the copy's size."""
        _, _, _, _, _, first_page, last_page, _ = span(s)
        start = window_start(s, j) if action == "start" else 0
        for i in range(pages_per_block):
            idx = first_page + j * pages_per_block + i

            @pl.when(idx <= last_page)
            def _(idx=idx, i=i):  # pl.when calls it at once, with this iteration's page
                page = table_buf[slot, idx - start] if action == "start" else 0
                copy = pltpu.make_async_copy(kv_hbm.at[layer, page],
                                             kv_buf.at[slot, i], sems.at[slot])
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

    def attend_head(s, j, slot, h: int, c: int):
        """Online-softmax update of query head block h with KV head c of the page buffer."""
        qs, ctx, r0, r1, pos_hi, first_page, _, _ = span(s)
        start = (first_page + j * pages_per_block) * block_size
        token = t0 + _div(jax.lax.broadcasted_iota(jnp.int32, (rows, block_tokens), 0), group)
        q_pos = ctx + token - qs
        k_pos = start + jax.lax.broadcasted_iota(jnp.int32, (rows, block_tokens), 1)
        mask = (token >= r0) & (token < r1) & (k_pos <= q_pos) & ((window <= 0) | (q_pos - k_pos < window))
        # Unfetched or stale rows of the buffer may hold anything (NaN): keep them out of p @ V.
        v_ok = start + jax.lax.broadcasted_iota(jnp.int32, (block_tokens, 1), 0) <= pos_hi
        q = q_ref[h]
        w = _load_pair(kv_buf, slot, c, pair, q.dtype)
        if w.dtype != q.dtype:
            q = q.astype(jnp.float32)
        # head_dim a multiple of 128: K and V are the window's halves; else the window is both (q is zero on the
        # V lanes, and only the V lanes of p @ window are kept, outside the kernel)
        k, v = (w[:, :head_dim], w[:, head_dim:]) if head_dim % LANES == 0 else (w, w)
        precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
        scores = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                                     preferred_element_type=jnp.float32) * sm_scale
        if soft_cap:
            scores = soft_cap * jnp.tanh(scores / soft_cap)
        scores = jnp.where(mask, scores, MASKED)
        m_prev, l_prev = m_ref[h][:, :1], l_ref[h][:, :1]
        m_new = jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.where(mask, jnp.exp(scores - m_new), 0.0)
        v = jnp.where(v_ok, v, jnp.zeros_like(v))
        pv = jnp.dot(p.astype(v.dtype), v, precision=precision, preferred_element_type=jnp.float32)
        acc_ref[h] = acc_ref[h] * alpha + pv
        l_ref[h] = jnp.broadcast_to(l_prev * alpha + jnp.sum(p, axis=1, keepdims=True), (rows, LANES))
        m_ref[h] = jnp.broadcast_to(m_new, (rows, LANES))

    def attend(s, j, slot):
        if not select_kv_head:
            for h in range(num_kv_heads):
                attend_head(s, j, slot, h, h)
            return
        # The cache holds every KV head (replicated under tensor parallelism) and this shard's query heads
        # use head kv_offset, a traced value: one branch per KV head (static lane windows), one runs.
        for c in range(cache_kv_heads):
            pl.when(kv_offset == c)(functools.partial(attend_head, s, j, slot, 0, c))

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
                table_copy(after_s, after_j, slot).start()  # slot's window was read when (s, j) started

        page_copies(s, j, slot, "wait")
        attend(s, j, slot)
        return next_s, next_j, 1 - slot

    jax.lax.while_loop(lambda c: c[0] <= last, step, (first, jnp.int32(0), jnp.int32(0)))
    for h in range(num_kv_heads):
        l, acc = l_ref[h][:, :1], acc_ref[h]
        if has_sinks:
            l, acc = _fold_sinks(sinks_ref, h, group, m_ref[h][:, :1], l, acc)
        out = acc / jnp.maximum(l, 1e-30)
        o_ref[h] = (out * v_scale if v_scale != 1.0 else out).astype(o_ref.dtype)


def _fold_sinks(sinks_ref, h: int, group: int, m: jax.Array, l: jax.Array, acc: jax.Array):
    """Attention sinks (gpt-oss) of query head block h: row r of the block is query head h * group + r % group,
    whose sink (an SMEM scalar) adds exp(sink - m) to the denominator and nothing to the numerator."""
    rows = m.shape[0]
    head = jax.lax.rem(jax.lax.broadcasted_iota(jnp.int32, (rows, LANES), 0), jnp.int32(group))
    sink = jnp.full((rows, LANES), sinks_ref[h * group], jnp.float32)
    for g in range(1, group):
        sink = jnp.where(head == g, sinks_ref[h * group + g], sink)
    sink = sink[:, :1]
    m_new = jnp.maximum(m, sink)
    alpha = jnp.exp(m - m_new)
    return l * alpha + jnp.exp(sink - m_new), acc * alpha


def tile_sequence_ranges(query_start_loc: jax.Array, num_seqs: jax.Array, num_tiles: int,
                         tq: int) -> tuple[jax.Array, jax.Array]:
    """First and last sequence with query rows in each tile of `tq` tokens (first > last: empty tile)."""
    num_seqs = jnp.reshape(num_seqs, ())
    total = query_start_loc[num_seqs]
    ends = query_start_loc[1:]
    t0 = jnp.arange(num_tiles, dtype=jnp.int32) * tq
    t_last = jnp.minimum(t0 + tq, total) - 1
    first = jnp.searchsorted(ends, t0, side="right").astype(jnp.int32)
    last = jnp.minimum(jnp.searchsorted(ends, t_last, side="right").astype(jnp.int32), num_seqs - 1)
    empty = t0 >= total
    return jnp.where(empty, 1, first), jnp.where(empty, 0, last)


def ragged_paged_attention_tpu(q: jax.Array, kv_cache: jax.Array, block_tables: jax.Array, seq_lens: jax.Array,
                               query_start_loc: jax.Array, num_seqs: jax.Array, *, sm_scale: float,
                               sliding_window: int | jax.Array | None = None, soft_cap: float | None = None,
                               layer_index: jax.Array | int | None = None, interpret=False,
                               tq: int | None = None,
                               pages_per_block: int | None = None, kv_head_offset: jax.Array | int | None = None,
                               chip=None, k_scale: float = 1.0, v_scale: float = 1.0,
                               sinks: jax.Array | None = None) -> jax.Array:
    """Same contract as xla_attention.ragged_paged_attention, over the lane-dense cache (kv_layout.py): [num_layers,
    num_blocks, block_size, lanes] with `layer_index`, else one layer [num_blocks, block_size, lanes]; `interpret`
    is passed to pallas_call.

    `kv_head_offset` (tensor parallelism over more devices than KV heads, the cache replicated): all of q's
    heads attend the one KV head `kv_head_offset` (traced) of a cache that holds every KV head. Without it, q's
    heads cover the cache's KV heads in order (GQA group = q heads / cache KV heads).
    `chip`: the chips.ChipSpec to plan VMEM for (default: the chip being compiled for).
    `k_scale` / `v_scale`: the cache holds K / k_scale and V / v_scale (kv_quant); an fp8 cache's pages are cast
    to q's dtype in VMEM before the dots.
    `sinks` ([num_q_heads] float32, gpt-oss): read from SMEM once per tile at the final normalization; None
    (static) builds the kernel without them.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    if layer_index is None:
        kv_cache, layer_index = kv_cache[None], 0
    _, num_pages, block_size, _ = kv_cache.shape
    cache_kv_heads, pair = kv_cache_heads_of(kv_cache, head_dim), pair_lanes(head_dim)
    width = head_dim if head_dim % LANES == 0 else pair  # q / output rows in the kernel
    if kv_head_offset is None:
        num_kv_heads, offset = cache_kv_heads, jnp.int32(0)
    else:
        num_kv_heads, offset = 1, jnp.asarray(kv_head_offset, jnp.int32)
    group = num_q_heads // num_kv_heads
    num_seqs_padded, table_width = block_tables.shape
    plan = tpu_plan(num_tokens=num_tokens, num_seqs=num_seqs_padded, group=group, num_kv_heads=num_kv_heads,
                    head_dim=head_dim, block_size=block_size, q_dtype=q.dtype, kv_dtype=kv_cache.dtype,
                    table_width=table_width, cache_kv_heads=cache_kv_heads, chip=chip, tq=tq, width=width,
                    pages_per_block=pages_per_block)
    tq, pages_per_block = plan.tq, plan.pages_per_block
    num_tiles = -(-num_tokens // tq)
    padded = num_tiles * tq

    qg = jnp.pad(q, ((0, padded - num_tokens), (0, 0), (0, 0))).reshape(padded, num_kv_heads, group, head_dim)
    qg = qg.transpose(1, 0, 2, 3).reshape(num_kv_heads, padded * group, head_dim)
    if width != head_dim:  # q in the K lanes of a pair window, zeros on the V lanes
        qg = jnp.pad(qg, ((0, 0), (0, 0), (0, width - head_dim)))
    first, last = tile_sequence_ranges(query_start_loc, num_seqs, num_tiles, tq)
    window = jnp.int32(0) if sliding_window is None else jnp.asarray(sliding_window, jnp.int32)
    params = jnp.stack([jnp.asarray(layer_index, jnp.int32).reshape(()), window.reshape(()), offset.reshape(())])
    prefetch = (first, last, query_start_loc.astype(jnp.int32), seq_lens.astype(jnp.int32), params)
    tables = block_tables.astype(jnp.int32)
    if table_width % 128:  # the kernel copies 128-aligned windows of a row (the table's HBM tiling)
        tables = jnp.pad(tables, ((0, 0), (0, round_up(table_width, 128) - table_width)))
    window_cols = table_window(tables.shape[1], pages_per_block)

    rows = tq * group
    q_spec = pl.BlockSpec((num_kv_heads, rows, width), lambda i, *_: (0, i, 0))
    kernel = functools.partial(
        _kernel, tq=tq, group=group, block_size=block_size, pages_per_block=pages_per_block,
        table_window=window_cols, sm_scale=float(sm_scale) * float(k_scale), soft_cap=soft_cap,
        head_dim=head_dim, pair=pair, select_kv_head=kv_head_offset is not None, v_scale=float(v_scale),
        has_sinks=sinks is not None)
    in_specs = [q_spec, pl.BlockSpec(memory_space=_ANY), pl.BlockSpec(memory_space=_ANY)]
    inputs = [qg, kv_cache, tables]
    if sinks is not None:
        in_specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))
        inputs.append(sinks.astype(jnp.float32).reshape(num_q_heads))
    cost = attention_cost(num_tokens=num_tokens, num_seqs=num_seqs_padded, num_q_heads=num_q_heads,
                          cache_kv_heads=cache_kv_heads, head_dim=head_dim, block_size=block_size,
                          table_width=table_width, num_pages=num_pages, q_dtype=q.dtype, kv_dtype=kv_cache.dtype,
                          tile_tokens=tq)
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch), grid=(num_tiles,),
            in_specs=in_specs, out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((2, pages_per_block, *kv_cache.shape[2:]), kv_cache.dtype),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SMEM((2, window_cols), jnp.int32),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.VMEM((num_kv_heads, rows, LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, width), jnp.float32),
            ]),
        out_shape=jax.ShapeDtypeStruct(qg.shape, q.dtype),
        compiler_params=_CompilerParams(dimension_semantics=("parallel",), vmem_limit_bytes=plan.vmem_limit_bytes),
        cost_estimate=cost,
        interpret=interpret,
        name="vllm_jax_ragged_paged_attention",
    )(*prefetch, *inputs)
    if width != head_dim:
        out = out[..., head_dim:2 * head_dim]  # the V lanes of p @ window
    out = out.reshape(num_kv_heads, padded, group, head_dim).transpose(1, 0, 2, 3)
    return out.reshape(padded, num_q_heads, head_dim)[:num_tokens]


def interpret_params():
    """TPU interpret mode: simulated DMAs (executed at wait time) and NaN-filled fresh VMEM, so a missing wait
    or a read of an unfetched row shows up as a wrong or NaN result. Plain `True` on jax without it."""
    params = getattr(pltpu, "InterpretParams", None)
    return params() if params is not None else True


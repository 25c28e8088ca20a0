"""Ragged paged attention as a Mosaic TPU kernel (Pallas).

How the work is cut. The token axis is split into tiles of `tq` tokens; one grid step owns one tile and every
KV head, so each KV page is copied once per tile and serves all heads. Inside a step the kernel walks the
sequences whose query rows fall in the tile and, for each, only the pages those rows can see (from the
sliding-window start of the first row to the causal end of the last), `pages_per_block` pages at a time.
Pages are copied HBM -> VMEM by async DMA into one of two buffers while the other is being read; the
prefetch runs across page blocks and across sequence boundaries. Softmax is online, in float32 VMEM scratch.
Grid steps share no state, so the grid axis is "parallel" (megacore chips split it across cores).

Scalars (tile -> first/last sequence, query_start_loc, seq_lens, the flattened block table, the layer index
and the traced sliding window) are scalar-prefetched into SMEM. The cache stays in HBM (memory space ANY)
and is read only through DMAs of whole pages `cache[layer, page]`, so the stacked form never copies a layer.

GQA: queries are regrouped outside the kernel to [num_kv_heads, tokens * group, head_dim] (row = t * group + g),
so one KV head's query rows are a single 2-D [tq * group, head_dim] operand for the MXU.

K/V are interleaved on the head axis of a page ([block_size, 2 * num_kv_heads, head_dim]). Two ways to read one
head's rows out of the VMEM page buffer (`head_loads`):
* "strided": view the buffer as [rows * 2H, head_dim] and use a sublane-strided load (32-bit), or, for
  bfloat16, view it as uint32 so that K (row 2h) and V (row 2h+1) share one word and split the halves.
  The Mosaic path; needs 2H to be a multiple of the sublane tiling. Ref reshape/bitcast are not supported by
  the TPU interpret mode (InterpretParams), so this path is tested with `interpret=True`.
* "indexed": `buf[:, c, :]`. Used when the tiling condition fails and under InterpretParams.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MASKED = -1e30  # finite: rows that see nothing stay finite (exp(MASKED - MASKED) is never taken unmasked)
_LANES = 128
_ANY = getattr(pl, "ANY", None) or getattr(pltpu, "ANY", None) or pltpu.TPUMemorySpace.ANY
_CompilerParams = getattr(pltpu, "CompilerParams", None) or getattr(pltpu, "TPUCompilerParams")


def _sublane_packing(dtype) -> int:
    return max(1, 4 // jnp.dtype(dtype).itemsize)


def tpu_block_sizes(*, num_tokens: int, group: int, num_kv_heads: int, head_dim: int, block_size: int,
                    kv_dtype, max_blocks_per_seq: int, kv_buffer_bytes: int = 512 * 1024) -> tuple[int, int]:
    """-> (tq tokens per query tile, pages per KV block), from the shapes only (no per-chip table).

    tq: about 128 query rows (tq * group) per MXU pass, at least 16 tokens so rows stay a multiple of the
    bfloat16 sublane tiling, at most the padded batch. Pages per block: enough pages to fill `kv_buffer_bytes`
    per buffer (two buffers live at once), at least one, at most 32 DMAs and the table width.
    """
    tq = max(16, 128 // max(group, 1))
    tq = 1 << (tq.bit_length() - 1)
    tq = min(tq, -(-num_tokens // 16) * 16)
    page_bytes = block_size * 2 * num_kv_heads * head_dim * jnp.dtype(kv_dtype).itemsize
    pages = max(1, min(kv_buffer_bytes // page_bytes, 32, max_blocks_per_seq))
    return tq, pages


def default_head_loads(num_kv_heads: int, kv_dtype) -> str:
    """"strided" where Mosaic can flatten the page buffer for free, else "indexed"."""
    dt = jnp.dtype(kv_dtype)
    if dt not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        return "indexed"
    return "strided" if (2 * num_kv_heads) % (8 * _sublane_packing(dt)) == 0 else "indexed"


def _div(x: jax.Array, d: int) -> jax.Array:
    """Truncating division of non-negative int32 values (Mosaic lowers `//` through sign ops)."""
    return jax.lax.div(x, jnp.full_like(x, d))


def _load_kv_head(buf, h: int, mode: str) -> tuple[jax.Array, jax.Array]:
    """K and V rows ([rows, head_dim]) of KV head h from a VMEM page buffer [rows, 2H, head_dim]."""
    if mode == "indexed":
        return buf[:, 2 * h, :], buf[:, 2 * h + 1, :]
    rows, combined, head_dim = buf.shape
    flat = buf.reshape(rows * combined, head_dim)
    if buf.dtype == jnp.float32:
        return flat[2 * h::combined, :], flat[2 * h + 1::combined, :]
    # bfloat16 packs rows 2i (low half) and 2i+1 (high half) into one 32-bit word: K of head h is the low
    # half of word row h, V the high half; a bfloat16 value is the top half of the float32 with those bits.
    words = flat.bitcast(jnp.uint32)[h::combined // 2, :]
    k = pltpu.bitcast(words << 16, jnp.float32).astype(jnp.bfloat16)
    v = pltpu.bitcast(words & jnp.uint32(0xFFFF0000), jnp.float32).astype(jnp.bfloat16)
    return k, v


def _kernel(first_ref, last_ref, qsl_ref, lens_ref, tables_ref, params_ref,  # scalar prefetch (SMEM)
            q_ref, kv_hbm, o_ref,  # q/o: [H, tq * group, D] VMEM blocks; kv_hbm: [L, NB, BS, 2H, D] in HBM
            kv_buf, sems, m_ref, l_ref, acc_ref,  # scratch
            *, tq: int, group: int, block_size: int, pages_per_block: int, table_width: int,
            sm_scale: float, soft_cap: float | None, head_loads: str):
    num_kv_heads, rows, _ = q_ref.shape
    block_tokens = pages_per_block * block_size
    tile = pl.program_id(0)
    t0 = tile * tq
    layer, window = params_ref[0], params_ref[1]

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

    def page_copies(s, j, slot, action):
        """Start or wait for the DMAs of page block j of sequence s (the same predicate both times)."""
        _, _, _, _, _, first_page, last_page, _ = span(s)
        for i in range(pages_per_block):
            idx = first_page + j * pages_per_block + i

            @pl.when(idx <= last_page)
            def _():
                page = tables_ref[s * table_width + idx]
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
        page_copies(first, 0, 0, "start")

    def attend(s, j, slot):
        qs, ctx, r0, r1, pos_hi, first_page, _, _ = span(s)
        start = (first_page + j * pages_per_block) * block_size
        token = t0 + _div(jax.lax.broadcasted_iota(jnp.int32, (rows, block_tokens), 0), group)
        q_pos = ctx + token - qs
        k_pos = start + jax.lax.broadcasted_iota(jnp.int32, (rows, block_tokens), 1)
        mask = (token >= r0) & (token < r1) & (k_pos <= q_pos) & ((window <= 0) | (q_pos - k_pos < window))
        # Unfetched or stale rows of the buffer may hold anything (NaN): keep them out of p @ V.
        v_ok = start + jax.lax.broadcasted_iota(jnp.int32, (block_tokens, 1), 0) <= pos_hi
        buf = kv_buf.at[slot]
        for h in range(num_kv_heads):
            k, v = _load_kv_head(buf, h, head_loads)
            q = q_ref[h]
            if k.dtype != q.dtype:
                k, v = k.astype(jnp.float32), v.astype(jnp.float32)
                q = q.astype(jnp.float32)
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
            l_ref[h] = jnp.broadcast_to(l_prev * alpha + jnp.sum(p, axis=1, keepdims=True), (rows, _LANES))
            m_ref[h] = jnp.broadcast_to(m_new, (rows, _LANES))

    def step(carry):
        s, j, slot = carry
        last_block = j + 1 >= span(s)[-1]
        next_s, next_j = jnp.where(last_block, s + 1, s), jnp.where(last_block, 0, j + 1)

        @pl.when(next_s <= last)
        def _():
            page_copies(next_s, next_j, 1 - slot, "start")

        page_copies(s, j, slot, "wait")
        attend(s, j, slot)
        return next_s, next_j, 1 - slot

    jax.lax.while_loop(lambda c: c[0] <= last, step, (first, jnp.int32(0), jnp.int32(0)))
    for h in range(num_kv_heads):
        o_ref[h] = (acc_ref[h] / jnp.maximum(l_ref[h][:, :1], 1e-30)).astype(o_ref.dtype)


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
                               head_loads: str | None = None, tq: int | None = None,
                               pages_per_block: int | None = None) -> jax.Array:
    """Same contract as reference.ragged_paged_attention_xla; `interpret` is passed to pallas_call."""
    num_tokens, num_q_heads, head_dim = q.shape
    if layer_index is None:
        kv_cache, layer_index = kv_cache[None], 0
    _, _, block_size, combined, _ = kv_cache.shape
    num_kv_heads = combined // 2
    group = num_q_heads // num_kv_heads
    num_seqs_padded, table_width = block_tables.shape
    auto_tq, auto_pages = tpu_block_sizes(
        num_tokens=num_tokens, group=group, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
        kv_dtype=kv_cache.dtype, max_blocks_per_seq=table_width)
    tq, pages_per_block = tq or auto_tq, pages_per_block or auto_pages
    head_loads = head_loads or default_head_loads(num_kv_heads, kv_cache.dtype)
    num_tiles = -(-num_tokens // tq)
    padded = num_tiles * tq

    qg = jnp.pad(q, ((0, padded - num_tokens), (0, 0), (0, 0))).reshape(padded, num_kv_heads, group, head_dim)
    qg = qg.transpose(1, 0, 2, 3).reshape(num_kv_heads, padded * group, head_dim)
    first, last = tile_sequence_ranges(query_start_loc, num_seqs, num_tiles, tq)
    window = jnp.int32(0) if sliding_window is None else jnp.asarray(sliding_window, jnp.int32)
    params = jnp.stack([jnp.asarray(layer_index, jnp.int32).reshape(()), window.reshape(())])
    prefetch = (first, last, query_start_loc.astype(jnp.int32), seq_lens.astype(jnp.int32),
                block_tables.astype(jnp.int32).reshape(-1), params)

    rows = tq * group
    block_tokens = pages_per_block * block_size
    q_spec = pl.BlockSpec((num_kv_heads, rows, head_dim), lambda i, *_: (0, i, 0))
    kernel = functools.partial(
        _kernel, tq=tq, group=group, block_size=block_size, pages_per_block=pages_per_block,
        table_width=table_width, sm_scale=float(sm_scale), soft_cap=soft_cap, head_loads=head_loads)
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch), grid=(num_tiles,),
            in_specs=[q_spec, pl.BlockSpec(memory_space=_ANY)], out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((2, block_tokens, combined, head_dim), kv_cache.dtype),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.VMEM((num_kv_heads, rows, _LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, _LANES), jnp.float32),
                pltpu.VMEM((num_kv_heads, rows, head_dim), jnp.float32),
            ]),
        out_shape=jax.ShapeDtypeStruct(qg.shape, q.dtype),
        compiler_params=_CompilerParams(dimension_semantics=("parallel",)),
        interpret=interpret,
        name="vllm_jax_ragged_paged_attention",
    )(*prefetch, qg, kv_cache)
    out = out.reshape(num_kv_heads, padded, group, head_dim).transpose(1, 0, 2, 3)
    return out.reshape(padded, num_q_heads, head_dim)[:num_tokens]


def interpret_params():
    """TPU interpret mode: simulated DMAs (executed at wait time) and NaN-filled fresh VMEM, so a missing wait
    or a read of an unfetched row shows up as a wrong or NaN result. Plain `True` on jax without it."""
    params = getattr(pltpu, "InterpretParams", None)
    return params() if params is not None else True


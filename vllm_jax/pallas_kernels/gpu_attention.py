"""Ragged paged attention as a Triton-lowered Pallas GPU kernel.

How the work is cut. Each sequence's query rows are split into tiles of `tile_tokens` tokens that never cross
a sequence boundary (the tile table is built with a few jnp ops from query_start_loc, inside the jitted
step). A decode row is one tile; a prefill chunk is several (blocked queries). The grid is
(kv head, tile, kv split): flash-decoding splits the pages a tile can see into `num_splits` contiguous
ranges handled by different programs, so a small decode batch still fills the GPU; each program writes an
unnormalized partial (acc, running max, running sum) and a log-sum-exp merge in XLA combines the splits.
Programs whose tile or split is empty write an empty partial.

GQA: queries are regrouped to [num_kv_heads, tokens * group_pad, head_dim] (row = t * group_pad + g, the
group padded to a power of two for Triton) so one program's rows are a single 2-D operand and K/V are read
once per KV head. Pages are read straight from the cache: `cache[layer, page, :, 2h]` (K) and `2h + 1` (V),
one page per loop step; the layer index, block table and lengths are plain int32 inputs read as scalars.
Block sizes below 16 use a broadcast-multiply instead of `dot` (Triton's dot needs 16 in every dimension).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

MASKED = -1e30

try:  # Triton compiler options; the class was renamed across jax versions.
    from jax.experimental.pallas import triton as _plgpu
    _CompilerParams = getattr(_plgpu, "CompilerParams", None) or getattr(_plgpu, "TritonCompilerParams")
except ImportError:  # pragma: no cover - very old jax
    from jax.experimental.pallas import gpu as _plgpu
    _CompilerParams = getattr(_plgpu, "TritonCompilerParams")


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def gpu_block_sizes(*, num_tokens: int, num_seqs: int, group: int, num_kv_heads: int, table_width: int,
                    num_sms: int = 132) -> tuple[int, int]:
    """-> (query rows per program, kv splits), from the shapes only.

    Rows: 64 when the bucket is prefill-heavy (more than 4 tokens per sequence slot), else the smallest
    power of two >= 16 holding one token's group (decode rows then waste little MXU work). Splits: enough
    programs to cover about two waves of SMs, at most 16 and never more than the table width.
    """
    group_pad = _next_pow2(group)
    rows = 64 if num_tokens >= 4 * num_seqs else 16
    rows = max(rows, group_pad)
    tile_tokens = rows // group_pad
    num_tiles = -(-num_tokens // tile_tokens) + num_seqs
    splits = _next_pow2(max(1, -(-2 * num_sms // (num_kv_heads * num_tiles))))
    return rows, max(1, min(splits, 16, table_width))


def _kernel(tile_seq_ref, tile_q0_ref, qsl_ref, lens_ref, tables_ref, params_ref, q_ref, kv_ref,
            o_ref, m_ref, l_ref, *, rows: int, group: int, group_pad: int, block_size: int,
            num_splits: int, sm_scale: float, soft_cap: float | None):
    h, tile, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    tile_tokens = rows // group_pad
    layer, window = params_ref[0], params_ref[1]
    seq = tile_seq_ref[tile]
    valid = seq >= 0
    seq = jnp.maximum(seq, 0)
    q0 = tile_q0_ref[tile]
    qs = qsl_ref[seq]
    q_len = qsl_ref[seq + 1] - qs
    ctx = lens_ref[seq] - q_len
    num_tok = jnp.where(valid, jnp.clip(q_len - q0, 0, tile_tokens), 0)

    row = jax.lax.broadcasted_iota(jnp.int32, (rows,), 0)
    tok, g = jax.lax.div(row, group_pad), jax.lax.rem(row, group_pad)
    row_ok = (tok < num_tok) & (g < group)
    q_pos = ctx + q0 + tok
    q = q_ref[h, pl.ds((qs + q0) * group_pad, rows), :]

    # Pages this tile can see, then this program's share of them.
    pos_hi = ctx + q0 + num_tok - 1
    k_lo = jnp.where(window > 0, jnp.maximum(ctx + q0 - window + 1, 0), 0)
    first_page = jax.lax.div(k_lo, block_size)
    num_pages = jnp.where(num_tok > 0, jax.lax.div(jnp.maximum(pos_hi, 0), block_size) - first_page + 1, 0)
    per_split = jax.lax.div(num_pages + num_splits - 1, num_splits)
    lo = first_page + split * per_split
    hi = jnp.minimum(lo + per_split, first_page + num_pages)
    precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None

    def page_step(j, carry):
        m, l, acc = carry
        page = tables_ref[seq, j]
        k = kv_ref[layer, page, :, 2 * h, :]
        v = kv_ref[layer, page, :, 2 * h + 1, :]
        if k.dtype != q.dtype:
            k, v = k.astype(q.dtype), v.astype(q.dtype)
        k_pos = j * block_size + jax.lax.broadcasted_iota(jnp.int32, (block_size,), 0)
        # Slots past the sequence end may hold anything: keep them out of p @ V.
        v = jnp.where((k_pos <= pos_hi)[:, None], v, jnp.zeros_like(v))
        if block_size >= 16:
            s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                                    preferred_element_type=jnp.float32)
        else:
            s = jnp.sum(q.astype(jnp.float32)[:, None, :] * k.astype(jnp.float32)[None, :, :], axis=2)
        s = s * sm_scale
        if soft_cap:
            s = soft_cap * jnp.tanh(s / soft_cap)
        diff = q_pos[:, None] - k_pos[None, :]
        ok = row_ok[:, None] & (diff >= 0) & ((window <= 0) | (diff < window))
        s = jnp.where(ok, s, MASKED)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp(m - m_new)
        p = jnp.where(ok, jnp.exp(s - m_new[:, None]), 0.0)
        if block_size >= 16:
            pv = jnp.dot(p.astype(v.dtype), v, precision=precision, preferred_element_type=jnp.float32)
        else:
            pv = jnp.sum(p[:, :, None] * v.astype(jnp.float32)[None, :, :], axis=1)
        return m_new, l * alpha + jnp.sum(p, axis=1), acc * alpha[:, None] + pv

    init = (jnp.full((rows,), MASKED, jnp.float32), jnp.zeros((rows,), jnp.float32),
            jnp.zeros((rows, q.shape[-1]), jnp.float32))
    m, l, acc = jax.lax.fori_loop(lo, hi, page_step, init)
    o_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = l


def sequence_tiles(query_start_loc: jax.Array, num_seqs: jax.Array, num_tiles: int,
                   tile_tokens: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """-> (tile_seq, tile_q0, seq_first_tile): each tile's sequence (-1 past the last tile) and first query
    offset inside it, and each sequence's first tile index."""
    num_slots = query_start_loc.shape[0] - 1
    real = jnp.arange(num_slots) < jnp.reshape(num_seqs, ())
    q_lens = jnp.where(real, query_start_loc[1:] - query_start_loc[:-1], 0)
    counts = (q_lens + tile_tokens - 1) // tile_tokens
    ends = jnp.cumsum(counts).astype(jnp.int32)
    starts = ends - counts
    tid = jnp.arange(num_tiles, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(ends, tid, side="right"), num_slots - 1).astype(jnp.int32)
    valid = tid < ends[-1]
    q0 = jnp.where(valid, (tid - starts[seq]) * tile_tokens, 0)  # in bounds even for empty tiles
    return jnp.where(valid, seq, -1), q0, starts.astype(jnp.int32)


def ragged_paged_attention_gpu(q: jax.Array, kv_cache: jax.Array, block_tables: jax.Array, seq_lens: jax.Array,
                               query_start_loc: jax.Array, num_seqs: jax.Array, *, sm_scale: float,
                               sliding_window: int | jax.Array | None = None, soft_cap: float | None = None,
                               layer_index: jax.Array | int | None = None, interpret: bool = False,
                               rows: int | None = None, num_splits: int | None = None,
                               num_warps: int = 4, num_stages: int = 2) -> jax.Array:
    """Same contract as reference.ragged_paged_attention_xla; `interpret` is passed to pallas_call."""
    num_tokens, num_q_heads, head_dim = q.shape
    if layer_index is None:
        kv_cache, layer_index = kv_cache[None], 0
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3] // 2
    if head_dim & (head_dim - 1) or block_size & (block_size - 1):
        raise ValueError(f"pallas_gpu needs power-of-two head_dim and block_size; got {head_dim}, {block_size}")
    group = num_q_heads // num_kv_heads
    group_pad = _next_pow2(group)
    num_slots, table_width = block_tables.shape
    auto_rows, auto_splits = gpu_block_sizes(num_tokens=num_tokens, num_seqs=num_slots, group=group,
                                             num_kv_heads=num_kv_heads, table_width=table_width,
                                             num_sms=_num_sms())
    rows, num_splits = rows or auto_rows, num_splits or auto_splits
    tile_tokens = rows // group_pad
    num_tiles = -(-num_tokens // tile_tokens) + num_slots

    # [T, Hq, D] -> [Hkv, T * group_pad (+ one tile of padding), D]
    qg = q.reshape(num_tokens, num_kv_heads, group, head_dim)
    qg = jnp.pad(qg, ((0, tile_tokens), (0, 0), (0, group_pad - group), (0, 0)))
    qg = qg.transpose(1, 0, 2, 3).reshape(num_kv_heads, (num_tokens + tile_tokens) * group_pad, head_dim)
    tile_seq, tile_q0, seq_first_tile = sequence_tiles(query_start_loc, num_seqs, num_tiles, tile_tokens)
    window = jnp.int32(0) if sliding_window is None else jnp.asarray(sliding_window, jnp.int32)
    params = jnp.stack([jnp.asarray(layer_index, jnp.int32).reshape(()), window.reshape(())])

    kernel = functools.partial(_kernel, rows=rows, group=group, group_pad=group_pad, block_size=block_size,
                               num_splits=num_splits, sm_scale=float(sm_scale), soft_cap=soft_cap)
    whole = pl.BlockSpec()
    part_rows = num_tiles * rows
    o, m, l = pl.pallas_call(
        kernel,
        grid=(num_kv_heads, num_tiles, num_splits),
        in_specs=[whole] * 8,
        out_specs=[pl.BlockSpec((None, None, rows, head_dim), lambda h, i, s: (s, h, i, 0)),
                   pl.BlockSpec((None, None, rows), lambda h, i, s: (s, h, i)),
                   pl.BlockSpec((None, None, rows), lambda h, i, s: (s, h, i))],
        out_shape=[jax.ShapeDtypeStruct((num_splits, num_kv_heads, part_rows, head_dim), jnp.float32),
                   jax.ShapeDtypeStruct((num_splits, num_kv_heads, part_rows), jnp.float32),
                   jax.ShapeDtypeStruct((num_splits, num_kv_heads, part_rows), jnp.float32)],
        compiler_params=_CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="vllm_jax_ragged_paged_attention",
    )(tile_seq, tile_q0, query_start_loc.astype(jnp.int32), seq_lens.astype(jnp.int32),
      block_tables.astype(jnp.int32), params, qg, kv_cache)

    # Each token's rows in the partials, then the log-sum-exp merge of the splits.
    tokens = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(query_start_loc[1:], tokens, side="right"), num_slots - 1)
    offset = tokens - query_start_loc[seq]
    first_row = (seq_first_tile[seq] + offset // tile_tokens) * rows + (offset % tile_tokens) * group_pad
    first_row = jnp.where(tokens < query_start_loc[jnp.reshape(num_seqs, ())], first_row, 0)  # padding rows
    idx = first_row[:, None] + jnp.arange(group, dtype=jnp.int32)[None, :]  # [T, G]
    o, m, l = o[:, :, idx], m[:, :, idx], l[:, :, idx]  # [P, Hkv, T, G(, D)]
    m_all = jnp.max(m, axis=0)
    w = jnp.exp(m - m_all[None])
    l_all = jnp.sum(w * l, axis=0)
    out = jnp.sum(w[..., None] * o, axis=0) / jnp.maximum(l_all, 1e-30)[..., None]
    return out.transpose(1, 0, 2, 3).reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)


def _num_sms() -> int:
    """Streaming multiprocessors of the first GPU (132 on H100 if the runtime does not say)."""
    try:
        device = jax.devices()[0]
        return int(getattr(device, "core_count", 0)) or 132
    except Exception:  # pragma: no cover - no device / attribute
        return 132

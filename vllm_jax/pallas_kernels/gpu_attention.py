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

Any head_dim (Phi-3's 96): Triton blocks are powers of two, so the kernel works at `padded_head_dim` columns (the
next power of two, at least 16). The cache keeps its unpadded [.., 2H, head_dim] rows (no memory or KV-budget
cost); K and V chunks are read with a masked `plgpu.load` whose columns past head_dim are zeros and never fetched,
the query is zero-padded outside the kernel, so q . k and p @ V are exact, and the output's padding columns (zero)
are dropped after the merge. The scale stays the caller's 1 / sqrt(head_dim).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vllm_jax.pallas_kernels.costs import attention_cost
from vllm_jax.pallas_kernels.kv_quant import is_fp8
from vllm_jax.pallas_kernels.xla_common import fold_sinks

MASKED = -1e30

try:  # Triton compiler options; the class was renamed across jax versions.
    from jax.experimental.pallas import triton as _plgpu
    _CompilerParams = getattr(_plgpu, "CompilerParams", None) or _plgpu.TritonCompilerParams
except ImportError:  # pragma: no cover - very old jax
    from jax.experimental.pallas import gpu as _plgpu
    _CompilerParams = _plgpu.TritonCompilerParams


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def padded_head_dim(head_dim: int) -> int:
    """The width the kernels compute at: head_dim rounded up to a power of two, at least 16 (Triton's dot)."""
    return max(16, _next_pow2(head_dim))


def load_columns(ref, index: tuple, rows: int, head_dim: int, padded: int) -> jax.Array:
    """ref[*index, :] ([rows, head_dim]) read `padded` columns wide: a plain read when they are equal, else a
    masked load whose columns past head_dim are zeros (the memory past them is never read)."""
    if padded == head_dim:
        return ref[(*index, slice(None))]
    cols = jax.lax.broadcasted_iota(jnp.int32, (rows, padded), 1)
    return _plgpu.load(ref.at[(*index, pl.ds(0, padded))], mask=cols < head_dim, other=jnp.zeros((), ref.dtype))


# The float32 accumulator [rows, head_dim] of one program lives in registers: 64 x 256 (Gemma 2/3 prefill) is 128
# registers a thread over 4 warps; wider heads (Gemma 4's 512) take fewer query rows instead of spilling.
ACC_ELEMENTS = 64 * 256


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
            o_ref, m_ref, l_ref, *, rows: int, group: int, group_pad: int, block_size: int, kv_rows: int,
            num_splits: int, sm_scale: float, soft_cap: float | None, head_dim: int):
    h, tile, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    tile_tokens = rows // group_pad
    chunks_per_page = block_size // kv_rows
    layer, window, kv_head = params_ref[0], params_ref[1], params_ref[2] + h
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
    q = q_ref[h, pl.ds((qs + q0) * group_pad, rows), :]  # zero-padded to padded_head_dim columns
    padded = q.shape[-1]

    # KV chunks (kv_rows slots of a page) this tile can see, then this program's share of them.
    pos_hi = ctx + q0 + num_tok - 1
    k_lo = jnp.where(window > 0, jnp.maximum(ctx + q0 - window + 1, 0), 0)
    first_chunk = jax.lax.div(k_lo, kv_rows)
    num_chunks = jnp.where(num_tok > 0, jax.lax.div(jnp.maximum(pos_hi, 0), kv_rows) - first_chunk + 1, 0)
    per_split = jax.lax.div(num_chunks + num_splits - 1, num_splits)
    lo = first_chunk + split * per_split
    hi = jnp.minimum(lo + per_split, first_chunk + num_chunks)
    precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None

    def chunk_step(j, carry):
        m, l, acc = carry
        if chunks_per_page == 1:
            page, slots = tables_ref[seq, j], slice(None)
        else:
            page = tables_ref[seq, jax.lax.div(j, chunks_per_page)]
            slots = pl.ds(jax.lax.rem(j, chunks_per_page) * kv_rows, kv_rows)
        k = load_columns(kv_ref, (layer, page, slots, 2 * kv_head), kv_rows, head_dim, padded)
        v = load_columns(kv_ref, (layer, page, slots, 2 * kv_head + 1), kv_rows, head_dim, padded)
        if k.dtype != q.dtype:
            k, v = k.astype(q.dtype), v.astype(q.dtype)
        k_pos = j * kv_rows + jax.lax.broadcasted_iota(jnp.int32, (kv_rows,), 0)
        # Slots past the sequence end may hold anything: keep them out of p @ V.
        v = jnp.where((k_pos <= pos_hi)[:, None], v, jnp.zeros_like(v))
        if kv_rows >= 16:
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
        if kv_rows >= 16:
            pv = jnp.dot(p.astype(v.dtype), v, precision=precision, preferred_element_type=jnp.float32)
        else:
            pv = jnp.sum(p[:, :, None] * v.astype(jnp.float32)[None, :, :], axis=1)
        return m_new, l * alpha + jnp.sum(p, axis=1), acc * alpha[:, None] + pv

    init = (jnp.full((rows,), MASKED, jnp.float32), jnp.zeros((rows,), jnp.float32),
            jnp.zeros((rows, q.shape[-1]), jnp.float32))
    m, l, acc = jax.lax.fori_loop(lo, hi, chunk_step, init)
    o_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = l


def shared_memory_estimate(*, rows: int, kv_rows: int, head_dim: int, num_stages: int, dtype) -> int:
    """Shared memory of one program: Triton's pipeline keeps `num_stages` copies of the K and V chunks
    ([kv_rows, head_dim] each); the query block and the score tile may be staged there too."""
    item = jnp.dtype(dtype).itemsize
    return num_stages * 2 * kv_rows * head_dim * item + rows * head_dim * item + rows * kv_rows * 4


@dataclasses.dataclass(frozen=True)
class GpuPlan:
    rows: int  # query rows per program
    num_splits: int
    kv_rows: int  # KV slots per loop step (a page, or a power-of-two part of one)
    num_stages: int
    shared_memory_bytes: int
    chip: str


def gpu_plan(*, num_tokens: int, num_seqs: int, group: int, num_kv_heads: int, table_width: int, head_dim: int,
             block_size: int, dtype, chip=None, rows: int | None = None, num_splits: int | None = None,
             num_stages: int | None = None) -> GpuPlan:
    """Block sizes for `chip` (chips.ChipSpec; default: the chip being compiled for, H100's figures
    elsewhere): the shape rule (gpu_block_sizes) with the chip's SM count, query rows capped so the float32
    accumulator stays ACC_ELEMENTS (head_dim 512: 32 rows, not 64), then whole pages per loop step with
    two pipeline stages, halving the KV chunk (down to 16 slots) and then dropping to one stage until the
    estimate fits the chip's shared memory per block. A configuration that cannot fit is a ValueError."""
    from vllm_jax.pallas_kernels.chips import CHIPS, current_chip

    chip = chip or current_chip()
    if chip is None and jax.default_backend() == "gpu":  # a GPU not in the table: a conservative budget
        device = jax.devices()[0]
        chip = dataclasses.replace(CHIPS["a100"], name=device.device_kind, shared_memory_per_block_optin=99 * 1024,
                                   num_sms=int(getattr(device, "core_count", 0)) or 108,
                                   compute_capability=_compute_capability(device))
    if chip is None or chip.platform != "gpu":
        chip = CHIPS["h100"]  # CPU (interpret mode)
    if is_fp8(dtype) and chip.compute_capability < (8, 9):
        cc = ".".join(map(str, chip.compute_capability))
        raise ValueError(f"--kv-cache-dtype fp8 with pallas_gpu needs compute capability 8.9 or later (Triton's "
                         f"fp8 conversions); {chip.name} has {cc}: use --attention-backend xla or another "
                         f"--kv-cache-dtype")
    auto_rows, auto_splits = gpu_block_sizes(num_tokens=num_tokens, num_seqs=num_seqs, group=group,
                                             num_kv_heads=num_kv_heads, table_width=table_width,
                                             num_sms=chip.num_sms)
    auto_rows = min(auto_rows, max(16, _next_pow2(group), ACC_ELEMENTS // head_dim))
    rows, num_splits = rows or auto_rows, num_splits or auto_splits
    kv_rows, stages = block_size, num_stages or 2
    limit = chip.shared_memory_per_block_optin

    def estimate():
        return shared_memory_estimate(rows=rows, kv_rows=kv_rows, head_dim=head_dim, num_stages=stages, dtype=dtype)

    while estimate() > limit:
        if kv_rows > 16:
            kv_rows //= 2
        elif stages > 1 and num_stages is None:
            stages -= 1
        else:
            raise ValueError(
                f"pallas_gpu attention does not fit {chip.name}'s {limit // 1024} KiB of shared memory per block "
                f"({estimate() // 1024} KiB for {rows} query rows, head_dim {head_dim}); use a smaller --dtype "
                f"or lower --max-num-batched-tokens")
    return GpuPlan(rows=rows, num_splits=num_splits, kv_rows=kv_rows, num_stages=stages,
                   shared_memory_bytes=estimate(), chip=chip.name)


def _compute_capability(device) -> tuple[int, int]:
    """A CUDA device's compute capability ("8.9" in jax's device attribute); (0, 0) when unreadable."""
    try:
        major, minor = str(device.compute_capability).split(".")[:2]
        return int(major), int(minor)
    except (AttributeError, ValueError):
        return (0, 0)


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


def token_rows(query_start_loc: jax.Array, num_seqs: jax.Array, seq_first_tile: jax.Array, num_tokens: int,
               tile_tokens: int, rows: int, stride: int, width: int) -> jax.Array:
    """[T, width] indices of each token's rows in the kernel's partial outputs (a tile holds `tile_tokens` tokens
    of `stride` rows each, `rows` in all); padding tokens read row 0."""
    num_slots = query_start_loc.shape[0] - 1
    tokens = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(query_start_loc[1:], tokens, side="right"), num_slots - 1)
    offset = tokens - query_start_loc[seq]
    first_row = (seq_first_tile[seq] + offset // tile_tokens) * rows + (offset % tile_tokens) * stride
    first_row = jnp.where(tokens < query_start_loc[jnp.reshape(num_seqs, ())], first_row, 0)
    return first_row[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]


def ragged_paged_attention_gpu(q: jax.Array, kv_cache: jax.Array, block_tables: jax.Array, seq_lens: jax.Array,
                               query_start_loc: jax.Array, num_seqs: jax.Array, *, sm_scale: float,
                               sliding_window: int | jax.Array | None = None, soft_cap: float | None = None,
                               layer_index: jax.Array | int | None = None, interpret: bool = False,
                               rows: int | None = None, num_splits: int | None = None,
                               num_warps: int = 4, num_stages: int | None = None,
                               kv_head_offset: jax.Array | int | None = None, chip=None, k_scale: float = 1.0,
                               v_scale: float = 1.0, sinks: jax.Array | None = None) -> jax.Array:
    """Same contract as xla_attention.ragged_paged_attention; `interpret` is passed to pallas_call.
    `kv_head_offset`: all of q's heads attend that one KV head of a cache holding every KV head (tensor
    parallelism over more devices than KV heads); `chip`: the chips.ChipSpec to plan for. `k_scale` / `v_scale`:
    the cache holds K / k_scale and V / v_scale (kv_quant); an fp8 cache's chunks are cast to q's dtype before
    the dots, which Triton does on compute capability 8.9 and later only (refused on older GPUs). `sinks`
    ([num_q_heads] float32, gpt-oss) join the denominator in the split merge, outside the kernel."""
    num_tokens, num_q_heads, head_dim = q.shape
    if layer_index is None:
        kv_cache, layer_index = kv_cache[None], 0
    _, num_pages, block_size, combined, _ = kv_cache.shape
    if block_size & (block_size - 1):
        raise ValueError(f"pallas_gpu needs a power-of-two block_size; got {block_size}")
    padded = padded_head_dim(head_dim)
    num_kv_heads = combined // 2 if kv_head_offset is None else 1
    offset = jnp.int32(0) if kv_head_offset is None else jnp.asarray(kv_head_offset, jnp.int32)
    group = num_q_heads // num_kv_heads
    group_pad = _next_pow2(group)
    num_slots, table_width = block_tables.shape
    plan = gpu_plan(num_tokens=num_tokens, num_seqs=num_slots, group=group, num_kv_heads=num_kv_heads,
                    table_width=table_width, head_dim=padded, block_size=block_size, dtype=kv_cache.dtype,
                    chip=chip, rows=rows, num_splits=num_splits, num_stages=num_stages)
    rows, num_splits = plan.rows, plan.num_splits
    tile_tokens = rows // group_pad
    num_tiles = -(-num_tokens // tile_tokens) + num_slots

    # [T, Hq, D] -> [Hkv, T * group_pad (+ one tile of padding), padded D (zeros past head_dim)]
    qg = q.reshape(num_tokens, num_kv_heads, group, head_dim)
    qg = jnp.pad(qg, ((0, tile_tokens), (0, 0), (0, group_pad - group), (0, padded - head_dim)))
    qg = qg.transpose(1, 0, 2, 3).reshape(num_kv_heads, (num_tokens + tile_tokens) * group_pad, padded)
    tile_seq, tile_q0, seq_first_tile = sequence_tiles(query_start_loc, num_seqs, num_tiles, tile_tokens)
    window = jnp.int32(0) if sliding_window is None else jnp.asarray(sliding_window, jnp.int32)
    params = jnp.stack([jnp.asarray(layer_index, jnp.int32).reshape(()), window.reshape(()), offset.reshape(())])

    kernel = functools.partial(_kernel, rows=rows, group=group, group_pad=group_pad, block_size=block_size,
                               kv_rows=plan.kv_rows, num_splits=num_splits,
                               sm_scale=float(sm_scale) * float(k_scale),
                               soft_cap=soft_cap, head_dim=head_dim)
    whole = pl.BlockSpec()
    part_rows = num_tiles * rows
    partial_bytes = 3 * num_splits * num_kv_heads * part_rows * (padded + 2) * 4  # written, then merged
    cost = attention_cost(num_tokens=num_tokens, num_seqs=num_slots, num_q_heads=num_q_heads,
                          cache_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size,
                          table_width=table_width, num_pages=num_pages, q_dtype=q.dtype, kv_dtype=kv_cache.dtype,
                          tile_tokens=tile_tokens, extra_bytes=partial_bytes)
    o, m, l = pl.pallas_call(
        kernel,
        grid=(num_kv_heads, num_tiles, num_splits),
        in_specs=[whole] * 8,
        out_specs=[pl.BlockSpec((None, None, rows, padded), lambda h, i, s: (s, h, i, 0)),
                   pl.BlockSpec((None, None, rows), lambda h, i, s: (s, h, i)),
                   pl.BlockSpec((None, None, rows), lambda h, i, s: (s, h, i))],
        out_shape=[jax.ShapeDtypeStruct((num_splits, num_kv_heads, part_rows, padded), jnp.float32),
                   jax.ShapeDtypeStruct((num_splits, num_kv_heads, part_rows), jnp.float32),
                   jax.ShapeDtypeStruct((num_splits, num_kv_heads, part_rows), jnp.float32)],
        compiler_params=_CompilerParams(num_warps=num_warps, num_stages=plan.num_stages),
        cost_estimate=cost,
        interpret=interpret,
        name="vllm_jax_ragged_paged_attention",
    )(tile_seq, tile_q0, query_start_loc.astype(jnp.int32), seq_lens.astype(jnp.int32),
      block_tables.astype(jnp.int32), params, qg, kv_cache)

    # Each token's rows in the partials, then the log-sum-exp merge of the splits.
    idx = token_rows(query_start_loc, num_seqs, seq_first_tile, num_tokens, tile_tokens, rows, group_pad, group)
    o, m, l = o[:, :, idx, :head_dim], m[:, :, idx], l[:, :, idx]  # [P, Hkv, T, G(, D)]
    m_all = jnp.max(m, axis=0)
    w = jnp.exp(m - m_all[None])
    l_all = jnp.sum(w * l, axis=0)
    acc = jnp.sum(w[..., None] * o, axis=0)
    if sinks is not None:
        l_all, acc = fold_sinks(m_all, l_all, acc, sinks.reshape(num_kv_heads, 1, group))
    out = acc / jnp.maximum(l_all, 1e-30)[..., None]
    if v_scale != 1.0:
        out = out * v_scale
    return out.transpose(1, 0, 2, 3).reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)

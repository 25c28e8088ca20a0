"""DeepSeek MLA (absorbed form) as a Triton-lowered Pallas GPU kernel
(docs/architecture/12-families.md, "DeepSeek MLA").

The contract is mla_attention.mla_ragged_paged_attention's: q = [q_latent | q_rope | zeros] ([T, H, width]) scored
against the one cached row per token [c (kv_lora_rank) | k_rope | zeros], whose first kv_lora_rank entries are the
value; the result is [T, H, kv_lora_rank].

Triton blocks are powers of two and DeepSeek's row is 576 used lanes (640 stored), so a score is two dots: the
latent part (kv_lora_rank lanes, 512) and the rope part (the next `rope_block` lanes: qk_rope_head_dim rounded up
to a power of two, at least 16 for Triton's dot; 64 for DeepSeek, which reads 576 lanes of the 640). The value is
the latent part already loaded for the first dot. kv_lora_rank must be a power of two (every DeepSeek is 512).

How the work is cut is gpu_attention.py's, with the heads in place of a KV head's GQA group: the heads are split
into blocks of `head_block` (a power of two; the accumulator is [rows, kv_lora_rank] float32 in registers, so a
program holds 16 to 64 rows), a tile is `rows // head_block` tokens of one sequence, the grid is (head block,
tile, kv split), and a log-sum-exp merge in XLA combines the flash-decoding splits (with one split, the kernel
normalizes and writes q's dtype: the partials of a long prefill bucket are its largest temporaries). The cache
comes in as [L, blocks, block_size, width] (dropping its size-1 axis is free). An fp8 cache is cast to q's dtype
as it is read (Triton: compute capability 8.9 or later, refused before); the row's one scale is folded into the
score scale and the output.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vllm_jax.pallas_kernels.costs import attention_cost
from vllm_jax.pallas_kernels.gpu_attention import MASKED, _CompilerParams, _next_pow2, sequence_tiles, token_rows
from vllm_jax.pallas_kernels.kv_quant import is_fp8


@dataclasses.dataclass(frozen=True)
class MlaGpuPlan:
    head_block: int  # heads per program
    rows: int  # query rows (tokens x heads of the block) per program
    num_splits: int
    kv_rows: int  # cache rows per loop step
    num_stages: int
    shared_memory_bytes: int
    chip: str


def mla_gpu_plan(*, num_tokens: int, num_seqs: int, heads: int, kv_lora_rank: int, rope_block: int,
                 block_size: int, table_width: int, dtype, chip=None, rows: int | None = None,
                 num_splits: int | None = None) -> MlaGpuPlan:
    """Rows: 32 (16 when kv_lora_rank > 512: the accumulator lives in registers); a head block of
    min(heads, rows) heads. Splits: enough programs for about two waves of SMs, at most 16 and the table width.
    Then halve the KV chunk (down to 16) and drop to one pipeline stage until the shared-memory estimate fits."""
    from vllm_jax.pallas_kernels.chips import CHIPS, current_chip

    chip = chip or current_chip()
    if chip is None or chip.platform != "gpu":
        chip = CHIPS["h100"]
    if is_fp8(dtype) and chip.compute_capability < (8, 9):
        raise ValueError(f"--kv-cache-dtype fp8 with pallas_gpu needs compute capability 8.9 or later; {chip.name} "
                         f"has {'.'.join(map(str, chip.compute_capability))}: use --attention-backend xla")
    heads_pad = _next_pow2(heads)
    rows = rows or (32 if kv_lora_rank <= 512 else 16)
    head_block = min(heads_pad, rows)
    rows = max(rows, head_block)
    tile_tokens = rows // head_block
    num_tiles = -(-num_tokens // tile_tokens) + num_seqs
    programs = (heads_pad // head_block) * num_tiles
    auto_splits = _next_pow2(max(1, -(-2 * chip.num_sms // programs)))
    num_splits = num_splits or max(1, min(auto_splits, 16, table_width))
    item = jnp.dtype(dtype).itemsize
    kv_rows, stages = block_size, 2
    limit = chip.shared_memory_per_block_optin

    def estimate():
        width = kv_lora_rank + rope_block
        return stages * kv_rows * width * item + rows * width * item + rows * kv_rows * 4

    while estimate() > limit:
        if kv_rows > 16:
            kv_rows //= 2
        elif stages > 1:
            stages -= 1
        else:
            raise ValueError(f"pallas_gpu MLA attention does not fit {chip.name}'s {limit // 1024} KiB of shared "
                             f"memory per block ({estimate() // 1024} KiB); use --attention-backend xla")
    return MlaGpuPlan(head_block, rows, num_splits, kv_rows, stages, estimate(), chip.name)


def _kernel(tile_seq_ref, tile_q0_ref, qsl_ref, lens_ref, tables_ref, layer_ref, q_ref, kv_ref, o_ref, m_ref, l_ref,
            *, rows: int, head_block: int, heads: int, block_size: int, kv_rows: int, num_splits: int, rank: int,
            rope_block: int, sm_scale: float):
    hb, tile, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    tile_tokens = rows // head_block
    chunks_per_page = block_size // kv_rows
    layer = layer_ref[0]
    seq = tile_seq_ref[tile]
    valid = seq >= 0
    seq = jnp.maximum(seq, 0)
    q0 = tile_q0_ref[tile]
    qs = qsl_ref[seq]
    q_len = qsl_ref[seq + 1] - qs
    ctx = lens_ref[seq] - q_len
    num_tok = jnp.where(valid, jnp.clip(q_len - q0, 0, tile_tokens), 0)

    row = jax.lax.broadcasted_iota(jnp.int32, (rows,), 0)
    tok, g = jax.lax.div(row, head_block), jax.lax.rem(row, head_block)
    row_ok = (tok < num_tok) & (hb * head_block + g < heads)
    q_pos = ctx + q0 + tok
    q_rows = pl.ds((qs + q0) * head_block, rows)
    q_lat = q_ref[hb, q_rows, pl.ds(0, rank)]
    q_rope = q_ref[hb, q_rows, pl.ds(rank, rope_block)]

    pos_hi = ctx + q0 + num_tok - 1
    num_chunks = jnp.where(num_tok > 0, jax.lax.div(jnp.maximum(pos_hi, 0), kv_rows) + 1, 0)
    per_split = jax.lax.div(num_chunks + num_splits - 1, num_splits)
    lo = split * per_split
    hi = jnp.minimum(lo + per_split, num_chunks)
    precision = jax.lax.Precision.HIGHEST if q_lat.dtype == jnp.float32 else None

    def dot_t(a, b):
        return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=precision,
                                   preferred_element_type=jnp.float32)

    def chunk_step(j, carry):
        m, l, acc = carry
        if chunks_per_page == 1:
            page, slots = tables_ref[seq, j], slice(None)
        else:
            page = tables_ref[seq, jax.lax.div(j, chunks_per_page)]
            slots = pl.ds(jax.lax.rem(j, chunks_per_page) * kv_rows, kv_rows)
        c = kv_ref[layer, page, slots, pl.ds(0, rank)]
        k_rope = kv_ref[layer, page, slots, pl.ds(rank, rope_block)]
        if c.dtype != q_lat.dtype:
            c, k_rope = c.astype(q_lat.dtype), k_rope.astype(q_lat.dtype)
        k_pos = j * kv_rows + jax.lax.broadcasted_iota(jnp.int32, (kv_rows,), 0)
        s = (dot_t(q_lat, c) + dot_t(q_rope, k_rope)) * sm_scale
        ok = row_ok[:, None] & (k_pos[None, :] <= q_pos[:, None])
        s = jnp.where(ok, s, MASKED)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp(m - m_new)
        p = jnp.where(ok, jnp.exp(s - m_new[:, None]), 0.0)
        v = jnp.where((k_pos <= pos_hi)[:, None], c, jnp.zeros_like(c))  # slots past the end may hold anything
        pv = jnp.dot(p.astype(v.dtype), v, precision=precision, preferred_element_type=jnp.float32)
        return m_new, l * alpha + jnp.sum(p, axis=1), acc * alpha[:, None] + pv

    init = (jnp.full((rows,), MASKED, jnp.float32), jnp.zeros((rows,), jnp.float32),
            jnp.zeros((rows, rank), jnp.float32))
    m, l, acc = jax.lax.fori_loop(lo, hi, chunk_step, init)
    if num_splits == 1:  # nothing to merge: the normalized output, in q's dtype (half a float32 partial's bytes)
        acc = acc / jnp.maximum(l, 1e-30)[:, None]
    o_ref[...] = acc.astype(o_ref.dtype)
    m_ref[...] = m
    l_ref[...] = l


def mla_attention_gpu(q: jax.Array, kv_cache: jax.Array, block_tables: jax.Array, seq_lens: jax.Array,
                      query_start_loc: jax.Array, num_seqs: jax.Array, *, kv_lora_rank: int, qk_rope_head_dim: int,
                      sm_scale: float, layer_index: jax.Array | int | None = None, interpret: bool = False,
                      kv_scale: float = 1.0, rows: int | None = None, num_splits: int | None = None,
                      num_warps: int = 8, chip=None) -> jax.Array:
    """q [T, H, width] = [q_latent | q_rope | zeros]; `kv_cache` one layer [blocks, block_size, 1, width] or the
    stack with `layer_index`; -> [T, H, kv_lora_rank] in q's dtype. `kv_scale`: the cache holds row / kv_scale."""
    num_tokens, heads, width = q.shape
    rank = kv_lora_rank
    rope_block = max(16, _next_pow2(qk_rope_head_dim))
    if rank & (rank - 1) or rank < 16 or rank + rope_block > width:
        raise ValueError(f"pallas_gpu MLA needs a power-of-two kv_lora_rank (>= 16) and kv_lora_rank + "
                         f"{rope_block} <= the cache row ({width}); got kv_lora_rank {rank}: use "
                         f"--attention-backend xla")
    if layer_index is None:
        kv_cache, layer_index = kv_cache[None], 0
    num_layers, num_pages, block_size, _, _ = kv_cache.shape
    if block_size & (block_size - 1):
        raise ValueError(f"pallas_gpu needs a power-of-two block_size; got {block_size}")
    kv_rows_view = kv_cache.reshape(num_layers, num_pages, block_size, width)
    num_slots, table_width = block_tables.shape
    plan = mla_gpu_plan(num_tokens=num_tokens, num_seqs=num_slots, heads=heads, kv_lora_rank=rank,
                        rope_block=rope_block, block_size=block_size, table_width=table_width,
                        dtype=kv_cache.dtype, chip=chip, rows=rows, num_splits=num_splits)
    rows, head_block, num_splits = plan.rows, plan.head_block, plan.num_splits
    num_blocks = -(-heads // head_block)
    tile_tokens = rows // head_block
    num_tiles = -(-num_tokens // tile_tokens) + num_slots

    # [T, H, W] -> [head blocks, (T + one tile of padding) * head_block, W]; row = t * head_block + g
    qg = jnp.pad(q, ((0, tile_tokens), (0, num_blocks * head_block - heads), (0, 0)))
    qg = qg.reshape(num_tokens + tile_tokens, num_blocks, head_block, width).transpose(1, 0, 2, 3)
    qg = qg.reshape(num_blocks, (num_tokens + tile_tokens) * head_block, width)
    tile_seq, tile_q0, seq_first_tile = sequence_tiles(query_start_loc, num_seqs, num_tiles, tile_tokens)
    layer = jnp.asarray(layer_index, jnp.int32).reshape(1)
    kernel = functools.partial(_kernel, rows=rows, head_block=head_block, heads=heads, block_size=block_size,
                               kv_rows=plan.kv_rows, num_splits=num_splits, rank=rank, rope_block=rope_block,
                               sm_scale=float(sm_scale) * float(kv_scale))
    whole = pl.BlockSpec()
    part_rows = num_tiles * rows
    cost = attention_cost(num_tokens=num_tokens, num_seqs=num_slots, num_q_heads=heads, cache_kv_heads=1,
                          head_dim=rank + rope_block, block_size=block_size, table_width=table_width,
                          num_pages=num_pages, q_dtype=q.dtype, kv_dtype=kv_cache.dtype, tile_tokens=tile_tokens,
                          extra_bytes=3 * num_splits * num_blocks * part_rows * (rank + 2) * 4)
    o, m, l = pl.pallas_call(
        kernel,
        grid=(num_blocks, num_tiles, num_splits),
        in_specs=[whole] * 8,
        out_specs=[pl.BlockSpec((None, None, rows, rank), lambda h, i, s: (s, h, i, 0)),
                   pl.BlockSpec((None, None, rows), lambda h, i, s: (s, h, i)),
                   pl.BlockSpec((None, None, rows), lambda h, i, s: (s, h, i))],
        out_shape=[jax.ShapeDtypeStruct((num_splits, num_blocks, part_rows, rank),
                                        q.dtype if num_splits == 1 else jnp.float32),
                   jax.ShapeDtypeStruct((num_splits, num_blocks, part_rows), jnp.float32),
                   jax.ShapeDtypeStruct((num_splits, num_blocks, part_rows), jnp.float32)],
        compiler_params=_CompilerParams(num_warps=num_warps, num_stages=plan.num_stages),
        cost_estimate=cost,
        interpret=interpret,
        name="vllm_jax_mla_attention",
    )(tile_seq, tile_q0, query_start_loc.astype(jnp.int32), seq_lens.astype(jnp.int32),
      block_tables.astype(jnp.int32), layer, qg, kv_rows_view)

    # Each token's rows in the partials, then the log-sum-exp merge of the splits.
    idx = token_rows(query_start_loc, num_seqs, seq_first_tile, num_tokens, tile_tokens, rows, head_block,
                     head_block)  # [T, head_block]
    if num_splits == 1:
        out = o[0][:, idx]  # [blocks, T, head_block, rank], normalized by the kernel
    else:
        o, m, l = o[:, :, idx], m[:, :, idx], l[:, :, idx]  # [P, blocks, T, head_block(, rank)]
        m_all = jnp.max(m, axis=0)
        w = jnp.exp(m - m_all[None])
        out = jnp.sum(w[..., None] * o, axis=0) / jnp.maximum(jnp.sum(w * l, axis=0), 1e-30)[..., None]
    if kv_scale != 1.0:
        out = out * kv_scale
    out = out.transpose(1, 0, 2, 3).reshape(num_tokens, num_blocks * head_block, rank)
    return out[:, :heads].astype(q.dtype)

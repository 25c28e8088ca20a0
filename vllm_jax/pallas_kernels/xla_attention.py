"""The `xla` attention backend: ragged paged attention in plain XLA ops, shaped for CPU (and GSPMD under TP).

Attention is split in two parts merged with a log-sum-exp (docs/decisions.md, "Departures from the first
design"). The in-step part (the keys written this step, xla_common.in_step_attention) runs by tiles of query
rows, each meeting only the key tiles of its own sequences up to itself, instead of a dense [T, T] product. The
context part (the KV each sequence had before this step) reads each sequence's pages once, not once per query row:

* sequences with one query row (decode) gather their pages in groups of 8 sequences, packed first, so the
  padding rows and sequence slots of a bucket cost no page reads;
* sequences with several query rows and a context (a chunked prefill, a prefix-cache hit) run a loop over
  (sequence, tile of QT rows, chunk of pages): the tile's rows share each gathered chunk, a real matmul.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vllm_jax.pallas_kernels.precision import at_query_precision
from vllm_jax.pallas_kernels.xla_common import (
    MASKED,
    RowLayout,
    cap,
    fold_sinks,
    in_step_attention,
    in_step_keys,
    in_window,
    row_layout,
    window_value,
)

_CHUNK_BLOCKS = 8  # pages per iteration of a context loop
_QUERY_TILE = 64  # query rows per tile of a multi-row sequence
_DECODE_GROUP = 8  # one-row sequences per gather


@at_query_precision  # float32 means float32 on GPU and TPU too (precision.py)
def ragged_paged_attention(q: jax.Array, kv_cache: jax.Array, block_tables: jax.Array, seq_lens: jax.Array,
                           query_start_loc: jax.Array, num_seqs: jax.Array, *, sm_scale: float,
                           sliding_window: int | jax.Array | None = None, soft_cap: float | None = None,
                           layer_index: jax.Array | int | None = None, query_tile: int = _QUERY_TILE,
                           k_scale: float = 1.0, v_scale: float = 1.0, sinks: jax.Array | None = None,
                           shared_kv: bool = False) -> jax.Array:
    """[T, num_q_heads, head_dim]; the contract of AttentionBackend.attention (vllm_jax/attention/base.py). Pages
    are read as float32 (an fp8 cache's values exactly); k_scale joins sm_scale and v_scale the output
    (kv_quant); `sinks` join the denominator once every key is folded in. `shared_kv`: the cache's head axis holds
    rows that are both key and value (MLA's latent, mla_attention.py), not K/V pairs."""
    num_tokens, num_q_heads, head_dim = q.shape
    if layer_index is None:
        kv_cache, layer_index = kv_cache[None], 0
    num_kv_heads = kv_cache.shape[3] if shared_kv else kv_cache.shape[3] // 2
    block_tables, seq_lens, query_start_loc = map(jnp.asarray, (block_tables, seq_lens, query_start_loc))
    layout = row_layout(num_tokens, seq_lens, query_start_loc, num_seqs)
    window = window_value(sliding_window)
    qg = (q.astype(jnp.float32) * (sm_scale * k_scale)).reshape(num_tokens, num_kv_heads,
                                                                num_q_heads // num_kv_heads, head_dim)
    tile = min(query_tile, num_tokens)
    if num_tokens % tile or tile == num_tokens:  # one tile: the dense product, without a loop around it
        state = in_step_attention(qg, kv_cache, layer_index, block_tables, layout, window, soft_cap, shared_kv)
    else:
        state = _in_step_tiled(qg, kv_cache, layer_index, block_tables, query_start_loc, layout, window, soft_cap,
                               tile, shared_kv)

    width = block_tables.shape[1]
    tables = jnp.pad(block_tables, ((0, 0), (0, -(-width // _CHUNK_BLOCKS) * _CHUNK_BLOCKS - width)))
    live = jnp.arange(seq_lens.shape[0]) < jnp.reshape(num_seqs, ())
    has_context = live & (layout.context_lens > 0)
    pages = _PageReader(kv_cache, layer_index, tables, soft_cap, window, shared_kv)
    state = _single_row_context(qg, state, pages, seq_lens, query_start_loc, layout,
                                has_context & (layout.q_lens == 1))
    state = _multi_row_context(qg, state, pages, seq_lens, query_start_loc, layout, num_seqs,
                               has_context & (layout.q_lens > 1), tile)
    m, l, acc = state
    if sinks is not None:
        l, acc = fold_sinks(m, l, acc, sinks.reshape(num_kv_heads, num_q_heads // num_kv_heads))
    out = acc / jnp.maximum(l, 1e-30)[..., None]
    if v_scale != 1.0:
        out = out * v_scale
    return out.reshape(num_tokens, num_q_heads, head_dim).astype(q.dtype)


def _in_step_tiled(qg, kv_cache, layer_index, block_tables, query_start_loc, layout: RowLayout, window, soft_cap,
                   tile: int, shared_kv: bool = False):
    """The keys written this step, by tiles of `tile` rows: query tile i only meets key tiles from the one holding
    the start of its first row's sequence up to i (causal), instead of all T keys. Returns (m, l, acc)."""
    num_tokens, num_kv_heads, group, _ = qg.shape
    seq_idx, valid, q_pos = layout.seq_idx, layout.valid, layout.q_pos
    k_all, v_all = in_step_keys(kv_cache, layer_index, block_tables, layout, shared_kv)
    m = jnp.full((num_tokens, num_kv_heads, group), MASKED, jnp.float32)
    state = (m, jnp.zeros_like(m), jnp.zeros_like(qg))

    def query_tile(i, state):
        rows = i * tile + jnp.arange(tile)
        q = jax.lax.dynamic_slice_in_dim(qg, i * tile, tile)
        first_key_tile = query_start_loc[seq_idx[i * tile]] // tile

        def key_tile(j, carry):
            keys = j * tile + jnp.arange(tile)
            k = jax.lax.dynamic_slice_in_dim(k_all, j * tile, tile)
            v = jax.lax.dynamic_slice_in_dim(v_all, j * tile, tile)
            ok = ((seq_idx[rows][:, None] == seq_idx[keys][None, :]) & (keys[None, :] <= rows[:, None])
                  & valid[rows][:, None] & valid[keys][None, :]
                  & in_window(q_pos[rows][:, None], q_pos[keys][None, :], window))
            return _fold(carry, jnp.einsum("tkgd,skd->tkgs", q, k), v, ok[:, None, None, :], "tkgs,skd->tkgd",
                         soft_cap)

        init = tuple(jax.lax.dynamic_slice_in_dim(x, i * tile, tile) for x in state)
        out = jax.lax.fori_loop(first_key_tile, i + 1, key_tile, init)
        return tuple(jax.lax.dynamic_update_slice_in_dim(x, y, i * tile, 0) for x, y in zip(state, out))

    return jax.lax.fori_loop(0, num_tokens // tile, query_tile, state)


class _PageReader:
    """Reads chunks of sequences' pages from one layer of the cache."""

    def __init__(self, kv_cache, layer_index, tables, soft_cap, window, shared_kv: bool = False):
        self.kv_cache, self.layer_index, self.tables, self.shared_kv = kv_cache, layer_index, tables, shared_kv
        self.soft_cap, self.window = soft_cap, window
        self.chunk_tokens = _CHUNK_BLOCKS * kv_cache.shape[2]

    def chunk(self, seqs: jax.Array, j) -> tuple[jax.Array, jax.Array]:
        """(K, V) of chunk j of each sequence in `seqs` ([R]): [R, chunk_tokens, KVH, D] float32 each."""
        ids = jax.lax.dynamic_slice_in_dim(self.tables[seqs], j * _CHUNK_BLOCKS, _CHUNK_BLOCKS, axis=1)
        kv = self.kv_cache[self.layer_index, ids].astype(jnp.float32)  # [R, C, BS, 2*KVH, D]
        kv = kv.reshape(seqs.shape[0], self.chunk_tokens, *kv.shape[-2:])
        if self.shared_kv:
            return kv, kv
        return kv[:, :, 0::2], kv[:, :, 1::2]


def _fold(state, scores: jax.Array, v: jax.Array, ok: jax.Array, spec: str, soft_cap: float | None):
    """Online-softmax update of (m, l, acc) with `scores` [..., c] masked by `ok`; `spec` is the p @ v einsum.
    A row that sees nothing yet accumulates junk at m = MASKED, wiped (alpha = 0) by its first visible key."""
    m, l, acc = state
    scores = jnp.where(ok, cap(scores, soft_cap), MASKED)
    m_new = jnp.maximum(m, scores.max(-1))
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(scores - m_new[..., None])
    return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + jnp.einsum(spec, p, v)


def _single_row_context(qg, state, pages: _PageReader, seq_lens, query_start_loc, layout, selected):
    """Context of the one-row sequences, `_DECODE_GROUP` at a time: row i of a gather is sequence i's only query
    row. The selected sequences are packed first, so padding sequence slots cost no gathers."""
    num_tokens, num_slots = qg.shape[0], seq_lens.shape[0]
    group = min(_DECODE_GROUP, num_slots)
    order = jnp.argsort(~selected, stable=True)  # selected sequence slots first
    num_selected = selected.sum()

    def one_group(g, state):
        seqs = jax.lax.dynamic_slice_in_dim(order, g * group, group)
        live = g * group + jnp.arange(group) < num_selected
        rows = jnp.clip(query_start_loc[seqs], 0, num_tokens - 1)
        context = jnp.where(live, layout.context_lens[seqs], 0)
        q_pos = seq_lens[seqs] - 1
        q = qg[rows]

        def chunk(j, carry):
            k, v = pages.chunk(seqs, j)
            k_pos = j * pages.chunk_tokens + jnp.arange(pages.chunk_tokens, dtype=jnp.int32)
            ok = (k_pos[None, :] < context[:, None]) & in_window(q_pos[:, None], k_pos[None, :], pages.window)
            scores = jnp.einsum("skgd,sckd->skgc", q, k)
            return _fold(carry, scores, v, ok[:, None, None, :], "skgc,sckd->skgd", pages.soft_cap)

        num_chunks = -(-context.max() // pages.chunk_tokens)
        sub = jax.lax.fori_loop(0, num_chunks, chunk, tuple(x[rows] for x in state))
        target = jnp.where(live, rows, num_tokens)  # padding entries of the group write nowhere
        return tuple(x.at[target].set(y, mode="drop") for x, y in zip(state, sub))

    return jax.lax.fori_loop(0, -(-num_selected // group), one_group, state)


def _multi_row_context(qg, state, pages: _PageReader, seq_lens, query_start_loc, layout, num_seqs, selected,
                       tile: int):
    """Context of the multi-row sequences: for each, tiles of `tile` consecutive rows against shared page chunks."""
    num_tokens = qg.shape[0]
    arange = jnp.arange(tile, dtype=jnp.int32)

    def one_tile(s, t, state):
        first = query_start_loc[s] + t * tile
        start = jnp.minimum(first, num_tokens - tile)  # a tile never runs past the bucket; rows < first are done
        rows = start + arange
        mine = (rows >= first) & (rows < query_start_loc[s + 1])
        q_pos = seq_lens[s] - layout.q_lens[s] + (rows - query_start_loc[s])
        q = jax.lax.dynamic_slice_in_dim(qg, start, tile)
        before = tuple(jax.lax.dynamic_slice_in_dim(x, start, tile) for x in state)

        def chunk(j, carry):
            k, v = pages.chunk(s[None], j)
            k_pos = j * pages.chunk_tokens + jnp.arange(pages.chunk_tokens, dtype=jnp.int32)
            ok = (mine[:, None] & (k_pos[None, :] < layout.context_lens[s])
                  & in_window(q_pos[:, None], k_pos[None, :], pages.window))
            scores = jnp.einsum("qkgd,ckd->qkgc", q, k[0])
            return _fold(carry, scores, v[0], ok[:, None, None, :], "qkgc,ckd->qkgd", pages.soft_cap)

        after = jax.lax.fori_loop(0, -(-layout.context_lens[s] // pages.chunk_tokens), chunk, before)
        return tuple(jax.lax.dynamic_update_slice_in_dim(x, _where_rows(mine, a, b), start, 0)
                     for x, a, b in zip(state, after, before))

    def one_seq(s, state):
        num_tiles = jnp.where(selected[s], -(-layout.q_lens[s] // tile), 0)
        return jax.lax.fori_loop(0, num_tiles, lambda t, st: one_tile(s, t, st), state)

    return jax.lax.fori_loop(0, jnp.reshape(num_seqs, ()), one_seq, state)


def _where_rows(rows: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    return jnp.where(rows.reshape(rows.shape + (1,) * (new.ndim - 1)), new, old)

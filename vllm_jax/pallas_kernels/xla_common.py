"""The XLA backend's building blocks in plain jnp: the KV-cache write, where each query row sits in the ragged
batch, the sliding-window and soft-cap rules, and the attention over the keys written this step.

The batch is ragged: sequence s owns query rows query_start_loc[s]:query_start_loc[s+1], and those rows are the
last q_len(s) positions of a sequence whose KV length after this step is seq_lens[s]. xla_attention.py splits
attention in two parts merged with a log-sum-exp: the keys written this step (`in_step_attention`, read back
from the cache at the batch's own slots) and the KV each sequence had before the step (its pages, streamed).

`kv_cache` is either one layer, [num_blocks, block_size, 2 * num_kv_heads, head_dim], or the whole stack
[num_layers, num_blocks, block_size, 2 * num_kv_heads, head_dim] together with `layer_index`; passing the stack
avoids slicing a layer out of the donated cache (docs/architecture/04-kv-cache.md, "KV cache layout"). K and V are
interleaved on the head axis: k0, v0, k1, v1, ... The kernels are tested against a numpy oracle that shares none
of this (tests/helpers/attention_oracle.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from vllm_jax.pallas_kernels.kv_quant import interleave

MASKED = -1e30  # large finite negative: fully masked rows stay finite instead of NaN


def write_kv_cache(kv_cache: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array,
                   layer_index: jax.Array | int | None = None, k_scale: float = 1.0,
                   v_scale: float = 1.0) -> jax.Array:
    """Scatter this step's K/V ([T, num_kv_heads, head_dim] each) into their slots; returns the updated cache.

    Padding tokens carry slots inside the null block 0, which no sequence reads. The cache holds K / k_scale and
    V / v_scale in its dtype (kv_quant.quantize: saturated for fp8).
    """
    return scatter_slots(kv_cache, interleave(k, v, kv_cache.dtype, k_scale, v_scale), slot_mapping, layer_index)


def scatter_slots(kv_cache, rows, slot_mapping, layer_index):
    """`rows` [T, ...] written at their token slots of the cache (of layer `layer_index` of a stacked one)."""
    if layer_index is None:
        nb, bs = kv_cache.shape[:2]
        flat = kv_cache.reshape(nb * bs, *kv_cache.shape[2:])
        return flat.at[slot_mapping].set(rows, mode="promise_in_bounds").reshape(kv_cache.shape)
    nl, nb, bs = kv_cache.shape[:3]
    flat = kv_cache.reshape(nl, nb * bs, *kv_cache.shape[3:])
    return flat.at[layer_index, slot_mapping].set(rows, mode="promise_in_bounds").reshape(kv_cache.shape)


@dataclass
class RowLayout:
    """Where each of the T query rows sits in the ragged batch."""

    seq_idx: jax.Array  # [T] the row's sequence (clipped into range for padding rows)
    valid: jax.Array  # [T] a real token, not padding
    q_pos: jax.Array  # [T] absolute position (0 for padding)
    q_lens: jax.Array  # [S] query rows per sequence
    context_lens: jax.Array  # [S] KV each sequence had before this step (0 for padding slots)


def row_layout(num_tokens: int, seq_lens: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array) -> RowLayout:
    seq_lens, query_start_loc = jnp.asarray(seq_lens), jnp.asarray(query_start_loc)
    num_seqs = jnp.reshape(num_seqs, ())[()]
    rows = jnp.arange(num_tokens, dtype=jnp.int32)
    seq_idx = jnp.searchsorted(query_start_loc[1:], rows, side="right", method="compare_all")
    seq_idx = jnp.clip(seq_idx, 0, seq_lens.shape[0] - 1)
    valid = rows < query_start_loc[num_seqs]
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    context_lens = jnp.where(jnp.arange(seq_lens.shape[0]) < num_seqs, seq_lens - q_lens, 0)
    q_pos = seq_lens[seq_idx] - q_lens[seq_idx] + (rows - query_start_loc[seq_idx])
    return RowLayout(seq_idx, valid, jnp.where(valid, q_pos, 0), q_lens, context_lens)


def in_step_keys(kv_cache: jax.Array, layer_index, block_tables: jax.Array, layout: RowLayout,
                 shared_kv: bool = False) -> tuple[jax.Array, jax.Array]:
    """K and V of the tokens written this step, read back from their slots: [T, KVH, D] float32 each.
    `shared_kv` (MLA's latent rows, mla_attention.py): every row is a key and also its value."""
    block_size = kv_cache.shape[2]
    q_pos = layout.q_pos
    slots = block_tables[layout.seq_idx, q_pos // block_size] * block_size + q_pos % block_size
    flat = kv_cache.reshape(kv_cache.shape[0], -1, *kv_cache.shape[3:])
    batch_kv = flat[layer_index, slots].astype(jnp.float32)  # [T, 2*KVH, D]
    if shared_kv:
        return batch_kv, batch_kv
    return batch_kv[:, 0::2], batch_kv[:, 1::2]


def in_step_attention(qg: jax.Array, kv_cache: jax.Array, layer_index, block_tables: jax.Array, layout: RowLayout,
                      window: jax.Array, soft_cap: float | None,
                      shared_kv: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Unnormalized softmax state (m, l, acc) of every row over the keys written this step: a [T, T] masked
    product over the batch's own slots, read back from the cache."""
    seq_idx, valid, q_pos = layout.seq_idx, layout.valid, layout.q_pos
    k_b, v_b = in_step_keys(kv_cache, layer_index, block_tables, layout, shared_kv)
    scores = cap(jnp.einsum("tkgd,skd->tkgs", qg, k_b), soft_cap)
    visible = ((seq_idx[:, None] == seq_idx[None, :]) & (q_pos[None, :] <= q_pos[:, None])
               & valid[:, None] & valid[None, :] & in_window(q_pos[:, None], q_pos[None, :], window))
    scores = jnp.where(visible[:, None, None, :], scores, MASKED)
    m = scores.max(-1)
    p = jnp.exp(scores - m[..., None])
    return m, p.sum(-1), jnp.einsum("tkgs,skd->tkgd", p, v_b)


def window_value(sliding_window: int | jax.Array | None) -> jax.Array:
    """0 means no window; a traced per-layer value is allowed (scan over layers with mixed windows)."""
    if sliding_window is None:
        return jnp.int32(0)
    return jnp.asarray(sliding_window, dtype=jnp.int32)


def in_window(q_pos: jax.Array, k_pos: jax.Array, window: jax.Array) -> jax.Array:
    # vLLM's meaning: a query at p sees keys p - w + 1 .. p.
    return (window <= 0) | (k_pos > q_pos - window)


def cap(scores: jax.Array, soft_cap: float | None) -> jax.Array:
    if soft_cap is None or soft_cap <= 0:
        return scores
    return soft_cap * jnp.tanh(scores / soft_cap)


def fold_sinks(m: jax.Array, l: jax.Array, acc: jax.Array,
               sinks: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Attention sinks (gpt-oss): one more logit per query head with no value, so it only adds exp(sink - m) to
    the softmax denominator. `sinks` broadcasts against m / l ([..., heads]); returns (l, acc) on the new max."""
    sinks = sinks.astype(jnp.float32)
    m_new = jnp.maximum(m, sinks)
    alpha = jnp.exp(m - m_new)
    return l * alpha + jnp.exp(sinks - m_new), acc * alpha[..., None]

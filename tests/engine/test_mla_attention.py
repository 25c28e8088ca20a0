"""MLA attention (pallas_kernels/mla_attention.py) in its absorbed form against a dense, non-absorbed numpy oracle
that expands every cached latent into per-head keys and values, as transformers does."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.ragged_batches import _lengths, paged_batch
from vllm_jax.pallas_kernels.mla_attention import mla_ragged_paged_attention, write_mla_cache

RANK, ROPE, NOPE, V_DIM, HEADS, BLOCK = 16, 8, 12, 10, 4, 4


def _oracle(q_nope, q_rope, cache, tables, seq_lens, qsl, n, w_uk, w_uv, scale):
    """Per real query row: softmax over its sequence's positions <= its own of
    (q_nope . W_UK c + q_rope . k_rope) * scale, times the expanded values W_UV c: [rows, H, V_DIM]."""
    out = []
    for s in range(n):
        ctx_len = int(seq_lens[s])
        rows = range(int(qsl[s]), int(qsl[s + 1]))
        slots = [(int(tables[s, p // BLOCK]), p % BLOCK) for p in range(ctx_len)]
        latent = np.stack([cache[b, o, 0, :RANK] for b, o in slots])  # [L, RANK]
        k_rope = np.stack([cache[b, o, 0, RANK:RANK + ROPE] for b, o in slots])
        k_nope = np.einsum("lr,rhd->lhd", latent, w_uk)
        values = np.einsum("lr,rhv->lhv", latent, w_uv)
        first_pos = ctx_len - len(rows)
        for i, row in enumerate(rows):
            visible = first_pos + i + 1
            scores = (np.einsum("hd,lhd->hl", q_nope[row], k_nope[:visible])
                      + np.einsum("hd,ld->hl", q_rope[row], k_rope[:visible])) * scale
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            out.append(np.einsum("hl,lhv->hv", p, values[:visible]))
    return np.stack(out)


@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
def test_absorbed_mla_matches_dense_expanded_attention(kind):
    rng = np.random.default_rng({"decode": 0, "prefill": 1, "mixed": 2}[kind])
    q_lens, ctx = _lengths(kind, rng)
    q, kv, tables, seq_lens, qsl, num_seqs, real = paged_batch(
        q_lens, q_lens + ctx, rng=rng, block_size=BLOCK, num_kv_heads=1, q_heads=HEADS, head_dim=RANK + ROPE,
        dtype=jnp.float32, layers=2)
    kv = kv[:, :, :, :1]  # one latent row per token: [layers, blocks, block, 1, RANK + ROPE]
    if kind == "mixed":  # lane padding after the row (MlaSpec.kv_cache_width): junk there must not matter
        kv = jnp.concatenate([kv, jnp.full(kv.shape[:-1] + (8,), 7.0, kv.dtype)], axis=-1)
    q_nope = rng.standard_normal((q.shape[0], HEADS, NOPE)).astype(np.float32)
    q_rope = np.asarray(q[..., RANK:])
    w_uk = (rng.standard_normal((RANK, HEADS, NOPE)) * 0.3).astype(np.float32)
    w_uv = rng.standard_normal((RANK, HEADS, V_DIM)).astype(np.float32)
    scale = (NOPE + ROPE) ** -0.5
    q_latent = jnp.einsum("thd,rhd->thr", q_nope, w_uk)
    out = mla_ragged_paged_attention(q_latent, jnp.asarray(q_rope), kv, tables, seq_lens, qsl, num_seqs,
                                     sm_scale=scale, layer_index=1)
    assert out.shape == (q.shape[0], HEADS, RANK)
    got = np.einsum("thr,rhv->thv", np.asarray(out), w_uv)[:real]
    want = _oracle(q_nope, q_rope, np.asarray(kv[1]), np.asarray(tables), np.asarray(seq_lens), np.asarray(qsl),
                   int(num_seqs[0]), w_uk, w_uv, scale)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)


def test_write_mla_cache_puts_latent_and_rope_in_one_row_per_slot():
    cache = jnp.full((2, 5, BLOCK, 1, RANK + ROPE + 8), 3.0, jnp.float32)  # 8 lanes of padding
    rng = np.random.default_rng(3)
    latent, rope = rng.standard_normal((3, RANK)), rng.standard_normal((3, ROPE))
    slots = jnp.asarray([6, 13, 0], jnp.int32)
    out = np.asarray(write_mla_cache(cache, jnp.asarray(latent), jnp.asarray(rope), slots, layer_index=1))
    np.testing.assert_allclose(out[1, 1, 2, 0], np.concatenate([latent[0], rope[0], np.zeros(8)]), rtol=1e-6)
    np.testing.assert_allclose(out[1, 3, 1, 0], np.concatenate([latent[1], rope[1], np.zeros(8)]), rtol=1e-6)
    assert (out[0] == 3.0).all()  # the other layer untouched
    with pytest.raises(ValueError, match="kv_lora_rank"):
        mla_ragged_paged_attention(jnp.zeros((2, HEADS, RANK)), jnp.zeros((2, HEADS, ROPE + 9)), cache,
                                   jnp.zeros((1, 2), jnp.int32), jnp.ones((1,), jnp.int32),
                                   jnp.asarray([0, 1], jnp.int32), jnp.ones((1,), jnp.int32), sm_scale=1.0)

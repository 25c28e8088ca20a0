"""The gated delta rule (gated DeltaNet's recurrence: Qwen3.5, Qwen3-Next) over a step's ragged batch, one
[Hv, dk, dv] float32 state per sequence (docs/architecture/17-state-cache.md, "Gated DeltaNet").

Per token, with q and k L2-normalised (q also scaled by dk**-0.5) and each key head shared by Hv // Hk value heads:
    S <- exp(g) * S;   S <- S + k (beta * (v - k^T S))^T;   o = q^T S
Two forms compute it: the recurrent one, one token per sequence (decode), vectorised over the rows; and the
chunked one (prefill), where each sequence's tokens are cut into chunks of `chunk_size` counted from its first new
token, everything inside a chunk is solved at once for every chunk (the UT transform: one unit lower-triangular
solve per chunk), and one loop over the chunks carries the states from chunk to chunk (the chunked form's rows of
one token take the decode step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from vllm_jax.model.ssm.ragged import query_lens, token_sequences

L2_EPS = 1e-6  # transformers' (and flash-linear-attention's) l2norm epsilon inside the kernel


def gated_delta_rule(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                     initial: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array, *,
                     chunk_size: int = 64) -> tuple[jax.Array, jax.Array]:
    """q, k [T, Hk, dk], v [T, Hv, dv], g [T, Hv] (log decay, <= 0), beta [T, Hv], initial [S, Hv, dk, dv] float32
    -> (o [T, Hv, dv] in v's dtype, final [S, Hv, dk, dv] float32). Tokens past query_start_loc[num_seqs] and rows
    past num_seqs are padding (their outputs are meaningless; padding rows, like rows with no tokens, keep their
    initial state).

    The recurrent form runs when every row has at most one token (a decode step, whatever its token bucket: the
    engine pads decode steps to token buckets larger than their rows), the chunked one otherwise: a `lax.cond`, since
    one (T, S) bucket holds both kinds of step."""
    args = (q, k, v, g, beta, initial, query_start_loc, num_seqs)
    all_single = jnp.all(query_lens(query_start_loc, num_seqs) <= 1)
    return jax.lax.cond(all_single, recurrent_gated_delta_rule,
                        lambda *a: chunked_gated_delta_rule(*a, chunk_size=chunk_size), *args)


def normalized_qk(q: jax.Array, k: jax.Array, num_v_heads: int) -> tuple[jax.Array, jax.Array]:
    """float32 q and k L2-normalised over dk (q also scaled by dk**-0.5), each key head repeated for the
    Hv // Hk consecutive value heads it serves (transformers' repeat_interleave): [..., Hv, dk] each."""
    def l2(x):
        x = x.astype(jnp.float32)
        return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)

    repeat = num_v_heads // q.shape[-2]
    qn, kn = l2(q) * (q.shape[-1] ** -0.5), l2(k)
    if repeat > 1:
        qn, kn = jnp.repeat(qn, repeat, axis=-2), jnp.repeat(kn, repeat, axis=-2)
    return qn, kn


def recurrent_gated_delta_rule(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                               initial: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array, *,
                               step: Callable | None = None) -> tuple[jax.Array, jax.Array]:
    """`gated_delta_rule` when every row has at most one token (decode): each row's token updates its state once,
    all rows at once. Rows with no token keep their state. `step`: the update itself, `decode_step` or a kernel
    with its signature (pallas_kernels/gated_delta_decode.py)."""
    rows = decode_rows(q, k, v, g, beta, query_start_loc, num_seqs)
    out, final = (step or decode_step)(*rows, initial.astype(jnp.float32))
    seq, _ = token_sequences(query_start_loc, q.shape[0])
    return out[seq].astype(v.dtype), final


def decode_rows(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                query_start_loc: jax.Array, num_seqs: jax.Array) -> tuple[jax.Array, ...]:
    """Each one-token row's token (at its query_start_loc) ready for `decode_step`, float32: q, k [S, Hv, dk]
    normalised, v [S, Hv, dv], g, beta [S, Hv]. The other rows (none or several tokens) get g = beta = 0, which
    leaves their state exactly as it was (times exp(0), plus k times a zero delta)."""
    num_tokens = q.shape[0]
    has_token = (query_lens(query_start_loc, num_seqs) == 1)[:, None]  # [S, 1]
    row_token = jnp.clip(query_start_loc[:-1], 0, num_tokens - 1)
    qr, kr = normalized_qk(q[row_token], k[row_token], v.shape[1])
    gr = jnp.where(has_token, g[row_token].astype(jnp.float32), 0.0)
    br = jnp.where(has_token, beta[row_token].astype(jnp.float32), 0.0)
    return qr, kr, v[row_token].astype(jnp.float32), gr, br


def decode_step(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                state: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One token per row (`decode_rows`' arrays) through the recurrence: (o [S, Hv, dv], new state)."""
    state = state * jnp.exp(g)[..., None, None]
    predicted = jnp.einsum("shk,shkv->shv", k, state)
    state = state + k[..., :, None] * ((v - predicted) * beta[..., None])[..., None, :]
    return jnp.einsum("shk,shkv->shv", q, state), state


@dataclass(frozen=True)
class ChunkLayout:
    """Where the tokens of the rows with two or more new tokens sit in `num_chunks` = T // C + S chunks of C, each
    chunk one sequence's (its tokens from chunk_start, chunk_len of them; sequence chunks in order, then unused
    chunks of length 0), and where each token's output is found again."""

    chunk_seq: jax.Array  # [N] int32: the sequence row each chunk belongs to
    chunk_start: jax.Array  # [N] int32: the chunk's first token
    chunk_len: jax.Array  # [N] int32: its tokens (0 for unused chunks)
    num_used: jax.Array  # [] int32: the chunks in use (the first ones)
    token_chunk: jax.Array  # [T] int32: the chunk holding each token
    token_pos: jax.Array  # [T] int32: the token's position in it


def chunk_layout(lens: jax.Array, query_start_loc: jax.Array, num_tokens: int, chunk_size: int) -> ChunkLayout:
    """The chunks of each multi-token row's new tokens (`lens` [S]), counted from its first new token. Row s of
    L_s tokens takes ceil(L_s / C) chunks, at most T // C + S in all (sum of ceil(L_s / C) <= (T + S (C - 1)) / C).
    Rows of one token take none (the decode step serves them)."""
    num_rows = query_start_loc.shape[0] - 1
    num_chunks = num_tokens // chunk_size + num_rows
    per_seq = jnp.where(lens > 1, (lens + chunk_size - 1) // chunk_size, 0)
    first = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(per_seq).astype(jnp.int32)])  # [S + 1]
    c = jnp.arange(num_chunks, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(first[1:], c, side="right").astype(jnp.int32), num_rows - 1)
    offset = (c - first[seq]) * chunk_size
    length = jnp.where(c < first[-1], jnp.clip(lens[seq] - offset, 0, chunk_size), 0)
    tok_seq, tok_index = token_sequences(query_start_loc, num_tokens)
    tok_chunk = jnp.clip(first[tok_seq] + tok_index // chunk_size, 0, num_chunks - 1)
    return ChunkLayout(seq, query_start_loc[seq] + offset, length, first[-1], tok_chunk, tok_index % chunk_size)


def chunked_gated_delta_rule(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                             initial: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array, *,
                             chunk_size: int = 64) -> tuple[jax.Array, jax.Array]:
    """`gated_delta_rule` for any ragged batch (prefills, prompt chunks that continue a state, decodes). Rows of
    one token take the decode step, all at once; the other rows' tokens are cut into chunks whose intra-chunk
    parts are computed for all chunks at once, then one loop over the chunks in use (a dynamic count: a step of
    many decodes and one prompt loops over the prompt's chunks only) reads and updates each chunk's row state."""
    num_tokens = q.shape[0]
    lens = query_lens(query_start_loc, num_seqs)
    decode_out, states = decode_step(*decode_rows(q, k, v, g, beta, query_start_loc, num_seqs),
                                     initial.astype(jnp.float32))
    layout = chunk_layout(lens, query_start_loc, num_tokens, chunk_size)
    pos = jnp.arange(chunk_size, dtype=jnp.int32)
    token = jnp.clip(layout.chunk_start[:, None] + pos[None, :], 0, num_tokens - 1)  # [N, C]
    valid = pos[None, :] < layout.chunk_len[:, None]  # [N, C]

    def gather(x):  # [T, H, ...] -> [N, H, C, ...] float32, zero outside each chunk's tokens
        x = jnp.where(valid.reshape(valid.shape + (1,) * (x.ndim - 1)), x[token].astype(jnp.float32), 0.0)
        return jnp.moveaxis(x, 2, 1)

    qn, kn = normalized_qk(q, k, v.shape[1])
    u, w, q_decayed, k_decayed, attn, decay = intra_chunk(gather(qn), gather(kn), gather(v), gather(g), gather(beta))

    def step(c, carry):
        states, out = carry
        seq = layout.chunk_seq[c]
        state = states[seq]  # [H, dk, dv]
        v_new = u[c] - w[c] @ state  # [H, C, dv]: what the chunk writes, less what the state already predicts
        new = state * decay[c][:, None, None] + jnp.swapaxes(k_decayed[c], -1, -2) @ v_new
        return states.at[seq].set(new), out.at[c].set(q_decayed[c] @ state + attn[c] @ v_new)

    final, out = jax.lax.fori_loop(0, layout.num_used, step, (states, jnp.zeros_like(u)))
    tok_seq, _ = token_sequences(query_start_loc, num_tokens)
    chunked = out[layout.token_chunk, :, layout.token_pos]
    return jnp.where((lens[tok_seq] == 1)[:, None, None], decode_out[tok_seq], chunked).astype(v.dtype), final


def intra_chunk(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array,
                beta: jax.Array) -> tuple[jax.Array, ...]:
    """Everything a chunk needs that does not depend on the state it starts from, for all chunks at once.
    q, k [N, H, C, dk], v [N, H, C, dv], g, beta [N, H, C] (zeros past a chunk's tokens: no decay, no write).

    With G the in-chunk cumulative log decay, the chunk's delta-rule writes solve the unit lower-triangular
    system (I + tril(beta_i k_i.k_j exp(G_i - G_j), -1)) X = [beta v | beta k exp(G)] (the UT transform), giving
    u (the values to write from a zero state) and w (how much the starting state cancels them). Returns (u, w, q
    decayed from the chunk start, k decayed to the chunk end, the causal decayed q.k within the chunk, the
    chunk's total decay exp(G_last) [N, H])."""
    size = q.shape[2]
    cum = jnp.cumsum(g, axis=-1)  # [N, H, C]
    causal = jnp.arange(size)[:, None] >= jnp.arange(size)[None, :]
    gaps = jnp.where(causal, cum[..., :, None] - cum[..., None, :], -jnp.inf)  # masked before exp: no overflow
    decays = jnp.exp(gaps)  # [N, H, C, C], zero above the diagonal
    k_beta = k * beta[..., None]
    strictly_lower = jnp.where(jnp.eye(size, dtype=bool), 0.0, (k_beta @ jnp.swapaxes(k, -1, -2)) * decays)
    system = strictly_lower + jnp.eye(size, dtype=jnp.float32)
    rhs = jnp.concatenate([v * beta[..., None], k_beta * jnp.exp(cum)[..., None]], axis=-1)
    solved = jax.lax.linalg.triangular_solve(system, rhs, left_side=True, lower=True, unit_diagonal=True)
    u, w = solved[..., :v.shape[-1]], solved[..., v.shape[-1]:]
    attn = (q @ jnp.swapaxes(k, -1, -2)) * decays
    q_decayed = q * jnp.exp(cum)[..., None]
    k_decayed = k * jnp.exp(cum[..., -1:] - cum)[..., None]
    return u, w, q_decayed, k_decayed, attn, jnp.exp(cum[..., -1])

"""Mamba2's selective state space scan (SSD) over a step's ragged batch, one [H, P, N] state per sequence
(docs/architecture/17-state-cache.md, "The step's states").

Per head h, with the group g(h) = h // (H / G) whose B / C it reads, each sequence runs
    state_t = exp(dt_t A) state_{t-1} + dt_t x_t B_t^T,    y_t = state_t C_t + D x_t
from its initial state. Two forms of the same recurrence:
- chunked (prefills): the tokens laid out as chunks of `chunk_size` that each belong to one sequence (the chunk
  boundaries counted from the row's first new token), the within-chunk parts for every chunk at once, and one
  `lax.scan` over the chunks carrying the sequences' states;
- recurrent (decode steps, at most one token per row): one update per row, vectorised over the rows.
Padding (rows past `num_seqs`, tokens past `query_start_loc[num_seqs]`, chunk positions past a sequence's end) is
laid out with dt = 0 and x = 0, which leaves a state exactly as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from vllm_jax.model.ssm.ragged import query_lens, token_sequences


def ssd(x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array, D: jax.Array, initial: jax.Array,
        query_start_loc: jax.Array, num_seqs: jax.Array, *, chunk_size: int) -> tuple[jax.Array, jax.Array]:
    """x [T, H, P], dt [T, H] (after the bias, softplus and the time-step clamp), A [H] (negative), B / C
    [T, G, N], D [H], initial [S, H, P, N] float32 -> (y [T, H, P] in x's dtype, final [S, H, P, N] float32).
    The recurrent form runs when every row has at most one token (a decode step, whatever its token bucket: the
    engine pads decode steps to token buckets larger than their rows), the chunked one otherwise: a `lax.cond`, as
    model/ssm/gated_delta.py picks its forms."""
    args = (x, dt, A, B, C, D, initial, query_start_loc, num_seqs)
    one_token_rows = jnp.all(query_lens(query_start_loc, num_seqs) <= 1)
    return jax.lax.cond(one_token_rows, ssd_recurrent, lambda *a: ssd_chunked(*a, chunk_size=chunk_size), *args)


def ssd_recurrent(x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array, D: jax.Array,
                  initial: jax.Array, query_start_loc: jax.Array,
                  num_seqs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`ssd` when each row has at most one token: row s's token sits at query_start_loc[s]."""
    num_tokens, heads, head_dim = x.shape
    rows, groups = initial.shape[0], B.shape[1]
    lens = query_lens(query_start_loc, num_seqs)
    token = jnp.clip(query_start_loc[:-1], 0, num_tokens - 1)
    live = lens == 1  # [S]
    xs = jnp.where(live[:, None, None], x[token].astype(jnp.float32), 0.0)  # [S, H, P]
    dts = jnp.where(live[:, None], dt[token].astype(jnp.float32), 0.0)  # [S, H]
    bs, cs = B[token].astype(jnp.float32), C[token].astype(jnp.float32)  # [S, G, N]
    decay = jnp.exp(dts * A.astype(jnp.float32))  # [S, H]
    dx = _grouped(dts[..., None] * xs, groups)  # [S, G, R, P]
    state = (initial.astype(jnp.float32) * decay[..., None, None]
             + (dx[..., None] * bs[:, :, None, None, :]).reshape(initial.shape))
    y = jnp.einsum("sgrpn,sgn->sgrp", _grouped(state, groups), cs).reshape(rows, heads, head_dim)
    y = y + D.astype(jnp.float32)[:, None] * xs
    seq, index = token_sequences(query_start_loc, num_tokens)
    out = jnp.where((index < lens[seq])[:, None, None], y[seq], 0.0)
    return out.astype(x.dtype), state


def ssd_chunked(x: jax.Array, dt: jax.Array, A: jax.Array, B: jax.Array, C: jax.Array, D: jax.Array,
                initial: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array, *,
                chunk_size: int) -> tuple[jax.Array, jax.Array]:
    """`ssd` in the chunked form: at most T // chunk_size + S chunks, each one sequence's run of up to
    `chunk_size` tokens. Heads are laid out as [G, R] (R = H / G heads per group), so each group's C . B products
    are computed once for its R heads."""
    num_tokens, heads, head_dim = x.shape
    groups = B.shape[1]
    layout = _ChunkLayout.of(query_start_loc, num_seqs, num_tokens, initial.shape[0], chunk_size)
    xc = layout.gather(x.astype(jnp.float32))  # [NC, c, H, P]
    dtc = layout.gather(dt.astype(jnp.float32))  # [NC, c, H]
    bc, cc = layout.gather(B.astype(jnp.float32)), layout.gather(C.astype(jnp.float32))  # [NC, c, G, N]
    dA = dtc * A.astype(jnp.float32)  # [NC, c, H]
    seg = _grouped(_segment_sums(dA), groups, axis=1)  # [NC, G, R, c (to), c (from)]
    dx = _grouped(dtc[..., None] * xc, groups, axis=2)  # [NC, c, G, R, P]: each token's input, discretised
    # within the chunk: y_l += sum_{s <= l} (C_l . B_s) exp(dA_{s+1..l}) dt_s x_s
    weights = jnp.einsum("jlgn,jsgn->jgls", cc, bc)[:, :, None] * jnp.exp(seg)
    y = jnp.einsum("jgrls,jsgrp->jlgrp", weights, dx)
    # what each chunk adds to its sequence's state, and how much it decays the state it starts from
    to_end = jnp.exp(seg[..., -1, :])  # [NC, G, R, c]: decay from after token l to the chunk's end
    added = jnp.einsum("jgrl,jlgrp,jlgn->jgrpn", to_end, dx, bc).reshape(-1, heads, head_dim, B.shape[2])
    chunk_decay = jnp.exp(jnp.sum(dA, axis=1))  # [NC, H]
    starts, final = _scan_chunks(initial.astype(jnp.float32), layout.seq, chunk_decay, added)
    # from the state the chunk started with: y_l += exp(dA_{0..l}) C_l . start
    from_start = _grouped(jnp.exp(jnp.cumsum(dA, axis=1)), groups, axis=2)  # [NC, c, G, R]
    y = y + from_start[..., None] * jnp.einsum("jlgn,jgrpn->jlgrp", cc, _grouped(starts, groups, axis=1))
    y = y.reshape(xc.shape) + D.astype(jnp.float32)[:, None] * xc
    return layout.scatter(y).astype(x.dtype), final


def _grouped(a: jax.Array, groups: int, axis: int = 1) -> jax.Array:
    """The head axis `axis` (H) split into [G, R]: head h is group h // R's r-th head, as transformers'
    repeat_interleave of B / C over the heads pairs them."""
    return a.reshape(*a.shape[:axis], groups, a.shape[axis] // groups, *a.shape[axis + 1:])


def _segment_sums(dA: jax.Array) -> jax.Array:
    """dA [NC, c, H] -> [NC, H, c, c]: entry (l, s) = dA[s+1] + ... + dA[l] for l >= s (0 on the diagonal), -inf
    above it. Summed per entry under a mask rather than as a difference of cumulative sums, which loses digits
    once the sums grow."""
    c = dA.shape[1]
    per_head = jnp.moveaxis(dA, 1, -1)  # [NC, H, c]
    k = jnp.arange(c)
    after_s = k[:, None] > k[None, :]  # [k, s]: k > s
    terms = jnp.where(after_s, per_head[..., :, None], 0.0)  # [NC, H, k, s]
    sums = jnp.cumsum(terms, axis=-2)  # [NC, H, l, s]: sum over s < k <= l
    return jnp.where(k[:, None] >= k[None, :], sums, -jnp.inf)


def _scan_chunks(initial: jax.Array, chunk_seq: jax.Array, chunk_decay: jax.Array,
                 added: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One pass over the chunks in order, carrying every sequence's state: (each chunk's start state
    [NC, H, P, N], the sequences' states after their last chunk [S, H, P, N])."""

    def step(states, chunk):
        seq, decay, add = chunk
        start = states[seq]
        return states.at[seq].set(start * decay[:, None, None] + add), start

    final, starts = jax.lax.scan(step, initial, (chunk_seq, chunk_decay, added))
    return starts, final


@dataclass(frozen=True)
class _ChunkLayout:
    """Where the ragged tokens sit in the [NC, c] chunk grid: chunk j holds `count[j]` tokens of sequence
    `seq[j]` from token `first[j]`; token t sits at (chunk[t], position[t]) when `live[t]`."""

    seq: jax.Array  # [NC] int32
    first: jax.Array  # [NC] int32
    count: jax.Array  # [NC] int32
    chunk: jax.Array  # [T] int32
    position: jax.Array  # [T] int32
    live: jax.Array  # [T] bool
    chunk_size: int

    @classmethod
    def of(cls, query_start_loc: jax.Array, num_seqs: jax.Array, num_tokens: int, num_rows: int,
           chunk_size: int) -> _ChunkLayout:
        num_chunks = num_tokens // chunk_size + num_rows
        lens = query_lens(query_start_loc, num_seqs)  # [S]
        per_seq = (lens + chunk_size - 1) // chunk_size
        ends = jnp.cumsum(per_seq)
        begins = ends - per_seq  # each sequence's first chunk
        j = jnp.arange(num_chunks, dtype=jnp.int32)
        seq = jnp.minimum(jnp.searchsorted(ends, j, side="right"), num_rows - 1).astype(jnp.int32)
        offset = (j - begins[seq]) * chunk_size  # the chunk's first token among its sequence's new tokens
        count = jnp.clip(lens[seq] - offset, 0, chunk_size)
        tok_seq, index = token_sequences(query_start_loc, num_tokens)
        chunk = jnp.minimum(begins[tok_seq] + index // chunk_size, num_chunks - 1)
        live = index < lens[tok_seq]
        return cls(seq, query_start_loc[seq] + offset, count, chunk, index % chunk_size, live, chunk_size)

    def gather(self, a: jax.Array) -> jax.Array:
        """[T, ...] -> [NC, c, ...], zeros where a chunk has no token."""
        pos = jnp.arange(self.chunk_size, dtype=jnp.int32)
        token = jnp.clip(self.first[:, None] + pos[None, :], 0, a.shape[0] - 1)
        filled = pos[None, :] < self.count[:, None]
        return jnp.where(filled.reshape(filled.shape + (1,) * (a.ndim - 1)), a[token], 0)

    def scatter(self, y: jax.Array) -> jax.Array:
        """[NC, c, ...] -> [T, ...], zeros for the padding tokens."""
        out = y[self.chunk, self.position]
        return jnp.where(self.live.reshape(self.live.shape + (1,) * (out.ndim - 1)), out, 0)

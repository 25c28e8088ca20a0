"""Where each token of a step's ragged batch sits: its sequence and its index inside that sequence's new tokens,
and which sequences start from a zero state. Shared by every recurrent mixer (docs/architecture/17-state-cache.md,
"The step's states")."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_sequences(query_start_loc: jax.Array, num_tokens: int) -> tuple[jax.Array, jax.Array]:
    """(sequence [T] int32, index within the sequence's new tokens [T] int32) for each of the step's T token rows.
    Padding tokens past the last sequence get the last sequence row and an index past its tokens."""
    num_seqs = query_start_loc.shape[0] - 1
    t = jnp.arange(num_tokens, dtype=jnp.int32)
    seq = jnp.searchsorted(query_start_loc[1:], t, side="right").astype(jnp.int32)
    seq = jnp.minimum(seq, num_seqs - 1)
    return seq, t - query_start_loc[seq]


def query_lens(query_start_loc: jax.Array, num_seqs: jax.Array) -> jax.Array:
    """[S] int32: each sequence row's new tokens this step (0 for the padding rows past `num_seqs`)."""
    lens = query_start_loc[1:] - query_start_loc[:-1]
    rows = jnp.arange(lens.shape[0], dtype=jnp.int32)
    return jnp.where(rows < num_seqs[0], lens, 0)


def starts_fresh(seq_lens: jax.Array, query_start_loc: jax.Array, num_seqs: jax.Array) -> jax.Array:
    """[S] bool: the sequences with no earlier tokens (their first chunk: the state starts at zero, whatever the
    slot held before; a preempted request recomputes from its first token, so it starts fresh too)."""
    return seq_lens - query_lens(query_start_loc, num_seqs) == 0


def read_states(pool: jax.Array, slots: jax.Array, fresh: jax.Array) -> jax.Array:
    """[S, ...] each sequence's state at the start of the step: its slot's, or zeros where it starts fresh."""
    states = pool[slots]
    return jnp.where(fresh.reshape((-1,) + (1,) * (states.ndim - 1)), jnp.zeros_like(states), states)


def write_states(pool: jax.Array, layer: int, slot_sets: tuple[jax.Array, ...], states: jax.Array) -> jax.Array:
    """The pool [layers, slots, ...] with each sequence's end-of-step state of `layer` in its slot of each of
    `slot_sets` ([S] each: the row's own slot, then its snapshot slot; 0, the null slot, for none and padding)."""
    states = states.astype(pool.dtype)
    for slots in slot_sets:
        pool = pool.at[layer, slots].set(states)
    return pool

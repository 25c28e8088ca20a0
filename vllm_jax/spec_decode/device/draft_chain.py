"""The draft model's proposal chain, packed on the host: k one-token steps per proposing request.

After the target's step the host knows each request's tokens (L of them). The draft model then runs k steps of one
token per request: step i feeds the token at position L - 1 + i (step 0 the target's newest token, later steps the
draft's own previous proposal) and proposes the next. Everything but the fed tokens is known before the chain
starts, so the host packs all k steps' positions, slots and lengths at once and the device runs the chain as one
program (docs/architecture/08-sampling.md, "Speculative decoding").

Slots come from the request's block table; the scheduler allocated k lookahead slots beyond each step's tokens
for this. A position past the request's slots (the end of the context) repeats the last one it has: the proposals
from there on are garbage and are cut off (`DraftChain.num_valid`). The positions it writes are never below the
target's next uncomputed token, so no valid KV is overwritten; the next catch-up step rewrites them anyway.
The EAGLE-3 head's chain is packed the same way (its k - 1 steps, every row of the step riding along), and its
catch-up step from the target's step inputs (`pack_catch_up`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np

from vllm_jax.model.step_inputs import StepInputs


@jax.tree_util.register_dataclass
@dataclass
class ChainInputs:
    """The chain's arrays, padded to a (T tokens, S sequences) bucket; row r of the batch is token r."""

    first_token_ids: jax.Array  # [T] int32: each row's newest token (what step 0 feeds)
    positions: jax.Array  # [k, T] int32
    slot_mapping: jax.Array  # [k, T] int32 (padding: the null block)
    seq_lens: jax.Array  # [k, S] int32
    block_tables: jax.Array  # [S, max_blocks_per_seq] int32
    query_start_loc: jax.Array  # [S + 1] int32
    num_seqs: jax.Array  # [1] int32
    logits_indices: jax.Array  # [S] int32


def chain_buckets(token_buckets: list[int], seq_bucket: Callable[[int], int],
                  max_num_seqs: int) -> list[tuple[int, int]]:
    """The (tokens, sequences) buckets the chain runs in: one token per proposing request, at most max_num_seqs
    of them (`seq_bucket`: the runner's pairing of a token bucket with its sequence bucket)."""
    largest = next(t for t in token_buckets if t >= max_num_seqs)
    return [(t, seq_bucket(t)) for t in token_buckets if t <= largest]


@dataclass
class DraftChain:
    inputs: ChainInputs
    num_valid: np.ndarray  # [rows] how many of each row's k proposals come from positions it has slots for


def pack_chain(token_ids: np.ndarray, num_tokens: np.ndarray, block_tables: np.ndarray, num_blocks: np.ndarray, *,
               k: int, block_size: int, max_model_len: int, num_tokens_padded: int, num_seqs_padded: int,
               active: np.ndarray | None = None) -> DraftChain:
    """The chain for `R` rows: their token buffers [R, W], known-token counts, block tables and block counts (the
    runner's input batch rows). Every active row must hold a slot for its newest token (its position L - 1);
    `active` (default all): the others ride along writing nothing (the null block; position 0 read back)."""
    rows = len(num_tokens)
    active = np.ones(rows, np.bool_) if active is None else active
    last = num_tokens.astype(np.int64) - 1  # the newest token's position
    capacity = np.minimum(num_blocks.astype(np.int64) * block_size, max_model_len)  # positions with slots
    if rows and (last[active] >= capacity[active]).any():
        raise ValueError("a proposing row has no slot for its newest token")
    steps = np.arange(k)[:, None]
    positions = np.where(active[None, :], np.minimum(last[None, :] + steps, capacity[None, :] - 1), 0)  # [k, R]
    block = block_tables[np.arange(rows)[None, :], positions // block_size]
    slots = np.where(active[None, :], block * block_size + positions % block_size, 0)

    def padded(values: np.ndarray, width: int) -> np.ndarray:
        out = np.zeros((k, width), np.int32)
        out[:, :rows] = values
        return out

    first = np.zeros(num_tokens_padded, np.int32)
    first[:rows] = token_ids[np.arange(rows), np.maximum(last, 0)]
    tables = np.zeros((num_seqs_padded, block_tables.shape[1]), np.int32)
    tables[:rows] = block_tables
    query_start_loc = np.full(num_seqs_padded + 1, rows, np.int32)
    query_start_loc[:rows + 1] = np.arange(rows + 1)
    logits_indices = np.zeros(num_seqs_padded, np.int32)
    logits_indices[:rows] = np.arange(rows)
    inputs = ChainInputs(first, padded(positions, num_tokens_padded), padded(slots, num_tokens_padded),
                         padded(positions + 1, num_seqs_padded), tables, query_start_loc,
                         np.array([rows], np.int32), logits_indices)
    num_valid = np.where(active, np.minimum(k, capacity - last), 0).astype(np.int32)
    return DraftChain(inputs, num_valid)


def pack_catch_up(inputs: StepInputs, kept: np.ndarray, next_token_ids: np.ndarray) -> tuple[StepInputs, np.ndarray]:
    """EAGLE's catch-up step from the target's step `inputs`: each row keeps its first `kept[r]` tokens (the rest
    were rejected proposals) at the same positions and slots, fed `next_token_ids` (the token after each kept one,
    rows concatenated); the last kept token of each row is its logits row. Returns the inputs and, per token, the
    target token it came from (to gather the target's hidden states)."""
    qsl = np.asarray(inputs.query_start_loc)
    rows, num_tokens = len(kept), inputs.input_ids.shape[0]
    gather = np.zeros(num_tokens, np.int32)
    total = int(kept.sum())
    gather[:total] = np.concatenate([np.arange(qsl[r], qsl[r] + kept[r]) for r in range(rows)]) if rows else []
    input_ids = np.zeros(num_tokens, np.int32)
    input_ids[:total] = next_token_ids
    positions = np.zeros(num_tokens, np.int32)
    positions[:total] = np.asarray(inputs.positions)[gather[:total]]
    slot_mapping = np.zeros(num_tokens, np.int32)  # padding: the null block
    slot_mapping[:total] = np.asarray(inputs.slot_mapping)[gather[:total]]
    seq_lens = np.asarray(inputs.seq_lens).copy()
    query_lens = qsl[1:rows + 1] - qsl[:rows]
    seq_lens[:rows] -= (query_lens - kept).astype(np.int32)
    query_start_loc = np.full_like(qsl, total)
    query_start_loc[:rows + 1] = np.concatenate([[0], np.cumsum(kept)])
    logits_indices = np.zeros_like(np.asarray(inputs.logits_indices))
    logits_indices[:rows] = query_start_loc[1:rows + 1] - 1
    return StepInputs(input_ids, positions, slot_mapping, np.asarray(inputs.block_tables), seq_lens,
                      query_start_loc, np.asarray(inputs.num_seqs), logits_indices), gather


def empty_chain(k: int, num_tokens: int, num_seqs: int, *, block_size: int, max_blocks_per_seq: int) -> ChainInputs:
    """A chain bucket's inputs with no rows: what warm-up compiles the chain programs for."""
    none = np.zeros(0, np.int32)
    return pack_chain(np.zeros((0, 1), np.int32), none, np.zeros((0, max_blocks_per_seq), np.int32), none, k=k,
                      block_size=block_size, max_model_len=1, num_tokens_padded=num_tokens,
                      num_seqs_padded=num_seqs).inputs

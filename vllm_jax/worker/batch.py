"""Host-side packing of a ragged batch into the padded StepInputs arrays (numpy, int32).

Each row contributes the tokens it computes this step, which continue a sequence whose first
`num_computed` tokens already have KV in its blocks. Padding tokens write to the null block 0 and padding rows
have seq_len 0. Used by research scripts that drive the step directly, by warm-up (empty batches), and as the
reference the ModelRunner's persistent input batch (worker/input_batch.py) is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_jax.model.step_inputs import StepInputs


@dataclass
class RowChunk:
    token_ids: list[int] | np.ndarray  # the tokens computed this step
    num_computed: int  # tokens of this sequence already in the KV cache
    block_ids: list[int] | np.ndarray  # the sequence's blocks, enough for num_computed + len(token_ids)
    state_slot: int = 0  # a hybrid model's state slot for the sequence (model/state_cache.py)


def pack_step_inputs(rows: list[RowChunk], *, block_size: int, max_blocks_per_seq: int, num_tokens_padded: int,
                     num_seqs_padded: int, state_slots: bool = False) -> StepInputs:
    """`state_slots`: the step carries each row's state slot (a hybrid model's)."""
    num_seqs = len(rows)
    q_lens = np.fromiter((len(r.token_ids) for r in rows), dtype=np.int32, count=num_seqs)
    total = int(q_lens.sum())
    if total > num_tokens_padded or num_seqs > num_seqs_padded:
        raise ValueError(f"batch of {total} tokens / {num_seqs} rows exceeds bucket "
                         f"({num_tokens_padded}, {num_seqs_padded})")
    input_ids = np.zeros(num_tokens_padded, np.int32)
    positions = np.zeros(num_tokens_padded, np.int32)
    # Padding tokens write into the null block (slots 0..block_size-1), which no sequence reads.
    slot_mapping = np.zeros(num_tokens_padded, np.int32)
    block_tables = np.zeros((num_seqs_padded, max_blocks_per_seq), np.int32)
    seq_lens = np.zeros(num_seqs_padded, np.int32)
    query_start_loc = np.full(num_seqs_padded + 1, total, np.int32)
    query_start_loc[0] = 0
    np.cumsum(q_lens, out=query_start_loc[1:num_seqs + 1])
    logits_indices = np.zeros(num_seqs_padded, np.int32)
    for i, row in enumerate(rows):
        start, n = int(query_start_loc[i]), int(q_lens[i])
        blocks = np.asarray(row.block_ids, dtype=np.int32)
        block_tables[i, :len(blocks)] = blocks
        pos = np.arange(row.num_computed, row.num_computed + n, dtype=np.int32)
        input_ids[start:start + n] = row.token_ids
        positions[start:start + n] = pos
        slot_mapping[start:start + n] = blocks[pos // block_size] * block_size + pos % block_size
        seq_lens[i] = row.num_computed + n
        logits_indices[i] = start + n - 1
    slots = zeros = None
    if state_slots:  # each row reads and writes its own slot; no snapshots
        slots, zeros = np.zeros(num_seqs_padded, np.int32), np.zeros(num_seqs_padded, np.int32)
        slots[:num_seqs] = [row.state_slot for row in rows]
    return StepInputs(input_ids=input_ids, positions=positions, slot_mapping=slot_mapping,
                      block_tables=block_tables, seq_lens=seq_lens, query_start_loc=query_start_loc,
                      num_seqs=np.array([num_seqs], np.int32), logits_indices=logits_indices, state_reads=slots,
                      state_slots=slots, state_snapshots=zeros)

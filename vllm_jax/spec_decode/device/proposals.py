"""Each step's proposals from a model on the device: the draft model's chain, the EAGLE-3 head's catch-up and chain.

The host side of spec_decode/device/draft_step.py and spec_decode/device/eagle_step.py: which input-batch rows
propose, their packed inputs, and how many of each row's k proposals count (docs/architecture/08-sampling.md,
"Speculative decoding"). The n-gram proposer needs none of this (spec_decode/ngram.py reads the input batch
directly).

Multi-host: process 0 packs the inputs and broadcasts them (`ProposalPayload`, through `broadcast`) before it runs
the program; the other processes run the same program on them (`follow_proposal`), in the same place in the
sequence of programs, since they replay every step process 0 broadcasts in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np

from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.sharding import multihost
from vllm_jax.spec_decode.device.draft_chain import pack_catch_up, pack_chain
from vllm_jax.spec_decode.device.draft_step import DraftStep
from vllm_jax.spec_decode.device.eagle_step import EagleStep
from vllm_jax.worker.buckets import pick_bucket
from vllm_jax.worker.input_batch import InputBatch
from vllm_jax.worker.step_payload import ProposalPayload

# process 0 of a multi-host run: sends a proposal step to the others before running it (None: one process)
Broadcast = Callable[[ProposalPayload], None] | None


@dataclass(frozen=True)
class ChainShapes:
    """What sizes the chain: the runner's buckets and the context."""

    token_buckets: list[int]
    seq_bucket: Callable[[int], int]
    block_size: int
    max_model_len: int

    def capacity(self, batch: InputBatch, slots: np.ndarray) -> np.ndarray:
        """Per slot: how many positions it holds slots for."""
        return np.minimum(batch.num_blocks[slots] * self.block_size, self.max_model_len)


def draft_model_proposals(drafter: DraftStep, batch: InputBatch, slots: np.ndarray,
                          shapes: ChainShapes, broadcast: Broadcast = None) -> list[np.ndarray]:
    """The draft model's k greedy proposals for these input-batch slots (one chain program, waited for). A row
    without a slot for its newest token (the pool had no lookahead blocks to give) gets none."""
    has_slot = batch.num_tokens[slots] <= shapes.capacity(batch, slots)
    proposals = [np.zeros(0, np.int32)] * len(slots)
    chained = slots[has_slot]
    if not len(chained):
        return proposals
    num_tokens = pick_bucket(shapes.token_buckets, len(chained))
    chain = pack_chain(batch.token_ids[chained], batch.num_tokens[chained], batch.block_table[chained],
                       batch.num_blocks[chained], k=drafter.k, block_size=shapes.block_size,
                       max_model_len=shapes.max_model_len, num_tokens_padded=num_tokens,
                       num_seqs_padded=shapes.seq_bucket(num_tokens))
    if broadcast is not None:
        broadcast(ProposalPayload(chain.inputs))
    proposed = drafter.propose(chain.inputs)
    for j, (row, n) in enumerate(zip(np.flatnonzero(has_slot).tolist(), chain.num_valid.tolist())):
        proposals[row] = proposed[j, :n]
    return proposals


def eagle_proposals(eagle: EagleStep, batch: InputBatch, slots: np.ndarray, inputs: StepInputs, kept: np.ndarray,
                    proposing: np.ndarray, aux_hidden: jax.Array, shapes: ChainShapes,
                    broadcast: Broadcast = None) -> list[np.ndarray]:
    """The EAGLE-3 head's run after a step: every row's `kept` tokens (the step's, less rejected proposals) caught
    up, and k greedy proposals for the `proposing` rows (the others get none). `inputs`: the target's step."""
    qsl = np.asarray(inputs.query_start_loc)
    starts = np.asarray(inputs.positions)[qsl[:len(slots)]]  # each row's first position this step
    next_tokens = np.concatenate([batch.token_ids[s, c + 1:c + 1 + n]
                                  for s, c, n in zip(slots.tolist(), starts.tolist(), kept.tolist())])
    catch_up, gather = pack_catch_up(inputs, kept, next_tokens)
    num_seqs = inputs.seq_lens.shape[0]
    capacity = shapes.capacity(batch, slots)
    chained = proposing & (batch.num_tokens[slots] <= capacity)
    chain = None
    if eagle.k > 1:  # proposals 2..k: one token per row, in the catch-up's row order (T = S)
        chain = pack_chain(batch.token_ids[slots], batch.num_tokens[slots], batch.block_table[slots],
                           batch.num_blocks[slots], k=eagle.k - 1, block_size=shapes.block_size,
                           max_model_len=shapes.max_model_len, num_tokens_padded=num_seqs,
                           num_seqs_padded=num_seqs, active=chained)
    chain_inputs = None if chain is None else chain.inputs
    if broadcast is not None:
        broadcast(ProposalPayload(chain_inputs, catch_up, gather))
    proposed = eagle.propose(aux_hidden, gather, catch_up, chain_inputs)
    num_valid = 1 + (chain.num_valid if chain is not None else 0) * np.ones(len(slots), np.int32)
    return [proposed[i, :n] if proposing[i] else np.zeros(0, np.int32)
            for i, n in enumerate(np.asarray(num_valid).tolist())]


def broadcast_proposal(payload: ProposalPayload) -> None:
    """Process 0: send a proposal step to the other processes (they run it in `follow_proposal`)."""
    multihost.broadcast_bytes(payload.to_bytes())


def follow_proposal(payload: ProposalPayload, drafter: DraftStep | None, eagle: EagleStep | None,
                    aux_hidden: jax.Array | None) -> None:
    """A non-leader process: run process 0's proposal step (dispatched, never read: only process 0 reads proposals).
    `aux_hidden`: the target's states from the step this process just ran (EAGLE-3)."""
    if payload.catch_up is not None:
        if eagle is None or aux_hidden is None:
            raise RuntimeError("process 0 sent an EAGLE-3 proposal step, but this process runs no EAGLE-3 head")
        eagle.dispatch(aux_hidden, payload.gather, payload.catch_up, payload.chain)
    elif drafter is not None:
        drafter.dispatch(payload.chain)
    else:
        raise RuntimeError("process 0 sent a draft model's proposal step, but this process runs no draft model")


def kept_tokens(query_start_loc: np.ndarray, num_rows: int, num_drafts: np.ndarray | None, completes: np.ndarray,
                sampled: list[list[int]]) -> np.ndarray:
    """Per row: the step's tokens that stay (its rejected proposals dropped): what the EAGLE-3 head catches up on."""
    qsl = np.asarray(query_start_loc)
    kept = (qsl[1:num_rows + 1] - qsl[:num_rows]).astype(np.int64)
    if num_drafts is not None:
        emitted = np.array([len(run) for run in sampled], np.int64)
        rejected = np.where(completes, num_drafts - (emitted - 1), 0)
        kept -= rejected
    return kept

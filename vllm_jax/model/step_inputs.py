"""StepInputs: one step's ragged batch, padded to a (T tokens, S sequences) bucket (docs/architecture/05-worker.md, "The
step's arrays"). The contract between the host side that packs it (worker/batch.py) and the model that reads it."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclass
class StepInputs:
    """One step's ragged batch, padded to a (T tokens, S sequences) bucket."""

    input_ids: jax.Array  # [T] int32
    positions: jax.Array  # [T] int32
    slot_mapping: jax.Array  # [T] int32
    block_tables: jax.Array  # [S, max_blocks_per_seq] int32
    seq_lens: jax.Array  # [S] int32
    query_start_loc: jax.Array  # [S + 1] int32
    num_seqs: jax.Array  # [1] int32
    logits_indices: jax.Array  # [S] int32
    # LoRA (docs/architecture/11-lora.md, "LoRA adapters"): [T] int32, each token's adapter slot (0: none; padding 0).
    # None when the engine has no LoRA: the programs then carry nothing of it.
    lora_slots: jax.Array | None = None
    # Vision-language models (docs/architecture/15-multimodal.md, "In the step"): M-RoPE's [3, T] int32 (t, h, w)
    # positions, the image tokens' embeddings [T, hidden] (model dtype) and which rows take them ([T] bool).
    # None for every other model.
    mrope_positions: jax.Array | None = None
    mm_embeds: jax.Array | None = None
    mm_mask: jax.Array | None = None
    # Hybrid models (docs/architecture/17-state-cache.md, "The step's states"): [S] int32 each, the slot a row's
    # recurrent states are read from (its own, or a prefix hit's snapshot), the slot its end states are written to,
    # and a snapshot slot they are also written to (0: none). Padding rows: the null slot 0. None for other models.
    state_reads: jax.Array | None = None
    state_slots: jax.Array | None = None
    state_snapshots: jax.Array | None = None


def real_logits_rows(logits_indices: jax.Array) -> jax.Array:
    """int32 [1]: how many of the S logits rows are real. The real rows' token indices increase (one row per
    sequence, or per verified position, in order) and the padding's are 0, so they are the positive entries, and
    the first entry as well when it is 0."""
    return (jnp.sum(logits_indices > 0) + (logits_indices[0] == 0)).astype(jnp.int32).reshape(1)

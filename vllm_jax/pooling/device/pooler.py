"""The pooler: one step's final hidden states [T, H] -> one vector per row [S, D], on the device.

Its own program per token bucket (pooling/device/pooling_step.py): it reads the forward's normed hidden states, which
never leave the device, and returns only the rows' pooled vectors (docs/architecture/14-pooling.md, "The pooling
program"). A prompt split over several chunks (chunked prefill) pools across them through `acc`, one float32 row
per input-batch slot (plus the padding rows' spare): MEAN adds each chunk's token sum to its slot's row, CLS keeps
the first chunk's first token; LAST needs nothing carried, its prompt's last token is in the last chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclass
class PoolInputs:
    """Per step, padded to its (T, S) bucket; padding rows name the spare slot and pool nothing anyone reads."""

    token_rows: jax.Array  # [T] int32: each token's row (S for padding tokens)
    first_index: jax.Array  # [S] int32: the row's first token in the step
    last_index: jax.Array  # [S] int32: the row's last token in the step
    slots: jax.Array  # [S] int32: the row's input-batch slot (its `acc` row)
    starts: jax.Array  # [S] bool: the step's tokens start the prompt (position 0)
    num_tokens: jax.Array  # [S] float32: the prompt's length (MEAN's divisor)
    dims: jax.Array  # [S] int32: the output entries kept (Matryoshka); the rest are zero


def pool(acc: jax.Array, hidden: jax.Array, p: PoolInputs, head: jax.Array | None, *, pooling_type: str,
         normalize: bool, activation: bool) -> tuple[jax.Array, jax.Array]:
    """-> (updated acc [slots + 1, H] float32, pooled [S, D] float32). `head`: the score head [labels, H] (a
    classifier's), applied after pooling; `activation`: softmax over the labels (sigmoid for one);
    `normalize`: L2 over the kept `dims` entries (an embedding truncated to its Matryoshka dimensions first)."""
    hidden = hidden.astype(jnp.float32)
    num_rows = p.last_index.shape[0]
    if pooling_type == "LAST":
        pooled = hidden[p.last_index]
    else:
        carried = jnp.where(p.starts[:, None], 0.0, acc[p.slots])
        if pooling_type == "MEAN":
            total = carried + jax.ops.segment_sum(hidden, p.token_rows, num_segments=num_rows + 1)[:num_rows]
            pooled = total / jnp.maximum(p.num_tokens, 1.0)[:, None]
        else:  # CLS: the prompt's first token, kept from its first chunk
            total = jnp.where(p.starts[:, None], hidden[p.first_index], carried)
            pooled = total
        acc = acc.at[p.slots].set(total)
    if head is not None:
        pooled = jnp.dot(pooled, head.astype(jnp.float32).T, preferred_element_type=jnp.float32)
        if activation:
            pooled = jax.nn.sigmoid(pooled) if pooled.shape[-1] == 1 else jax.nn.softmax(pooled, axis=-1)
    kept = jnp.arange(pooled.shape[-1])[None, :] < p.dims[:, None]
    pooled = jnp.where(kept, pooled, 0.0)
    if normalize:
        norm = jnp.sqrt(jnp.sum(pooled * pooled, axis=-1, keepdims=True))
        pooled = pooled / jnp.maximum(norm, 1e-12)
    return acc, pooled

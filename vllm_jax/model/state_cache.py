"""The device cache of a hybrid model: the paged K/V of its attention layers beside the per-sequence states of its
recurrent layers (docs/architecture/17-state-cache.md, "The state cache"). A pytree, donated through the step like
the plain K/V array of every other model."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class StateLayout:
    """One state slot of a model's recurrent layers: the conv's last K-1 inputs and the recurrence's state, per
    recurrent layer. Read from the family's spec (`DecoderSpec.state_layout`)."""

    num_layers: int  # recurrent layers
    conv_shape: tuple[int, ...]  # (K - 1, conv channels)
    recurrent_shape: tuple[int, ...]  # (heads, d_k, d_v) for DeltaNet, (heads, head_dim, d_state) for Mamba2
    recurrent_dtype: str = "float32"  # the recurrence accumulates in float32, as transformers keeps it

    def bytes_per_slot(self, conv_dtype: str) -> int:
        conv = int(np.prod(self.conv_shape)) * jnp.dtype(conv_dtype).itemsize
        recurrent = int(np.prod(self.recurrent_shape)) * jnp.dtype(self.recurrent_dtype).itemsize
        return self.num_layers * (conv + recurrent)


@jax.tree_util.register_dataclass
@dataclass
class HybridCache:
    """kv: the attention layers' paged K/V ([attention layers, blocks, ...] as every model's cache); conv
    [recurrent layers, slots, K - 1, channels] and recurrent [recurrent layers, slots, ...]: each slot one
    sequence's states (slot 0 the null slot padding rows write)."""

    kv: jax.Array
    conv: jax.Array
    recurrent: jax.Array

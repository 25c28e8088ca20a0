"""EAGLE-3's auxiliary hidden states: the residual stream entering a few chosen target layers, for every token.

The convention is vLLM's (`LlamaModel.forward` in vllm/model_executor/models/llama.py appends `hidden_states +
residual` just before running layer `idx` when `idx in aux_hidden_state_layers`): layer i's state is the input
of layer i, which is transformers' `output_hidden_states[i]` (index 0 is the embedding output). The chosen
layers' states are concatenated on the hidden axis in ascending layer order, as vLLM appends them while walking
the layers: [T, len(layers) * hidden], in the model dtype.

Inside a layer scan the states ride in the carry as one [K + 1, T, hidden] buffer: each layer writes its input
into its own row, and every layer that is not chosen writes row K, which is dropped at the end. One
dynamic-update-slice of [T, hidden] per layer, no select over the buffer and no per-layer outputs; with no
layers chosen the buffer is None (no leaves), so the program is the one without the option.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np


def eagle3_default_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's default auxiliary layers (`get_eagle3_aux_hidden_state_layers`): early, middle and late. Models
    of fewer than 7 layers repeat a layer, which `check_aux_layers` refuses."""
    return (2, num_layers // 2, num_layers - 3)


def check_aux_layers(layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """The layer ids as a sorted tuple of distinct ints within the model; otherwise a ValueError naming them."""
    ids = tuple(layers)
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"aux_hidden_layers must be layer indices (ints); got {ids!r}")
    bad = [int(i) for i in ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"aux_hidden_layers {bad} out of range: the model has {num_layers} layers (0.."
                         f"{num_layers - 1})")
    if len(set(ids)) != len(ids):
        raise ValueError(f"aux_hidden_layers {ids!r} repeat a layer")
    return tuple(sorted(int(i) for i in ids))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class AuxHiddenStates:
    """The chosen layers' input states collected so far (a pytree: safe in a scan carry)."""

    buffer: jax.Array | None  # [K + 1, T, hidden]; row K takes the layers not chosen. None: option off
    layers: tuple[int, ...] = field(metadata=dict(static=True))

    @classmethod
    def start(cls, layers: tuple[int, ...], num_layers: int, hidden: jax.Array) -> AuxHiddenStates:
        """An empty collection for `layers` (checked against `num_layers`) shaped like `hidden` [T, H]."""
        layers = check_aux_layers(layers, num_layers)
        if not layers:
            return cls(None, ())
        return cls(jnp.zeros((len(layers) + 1,) + hidden.shape, hidden.dtype), layers)

    def record(self, layer_index: jax.Array | int, hidden: jax.Array) -> AuxHiddenStates:
        """Keep `hidden` (the input of layer `layer_index`, static or traced) if that layer is chosen."""
        if self.buffer is None:
            return self
        k = len(self.layers)
        if isinstance(layer_index, (int, np.integer)):
            if layer_index not in self.layers:
                return self
            row = self.layers.index(int(layer_index))
        else:
            matches = jnp.asarray(np.array(self.layers, np.int32)) == layer_index
            row = jnp.where(jnp.any(matches), jnp.argmax(matches), k).astype(jnp.int32)
        return AuxHiddenStates(jax.lax.dynamic_update_index_in_dim(self.buffer, hidden, row, 0), self.layers)

    def concatenated(self) -> jax.Array | None:
        """[T, K * hidden]: the chosen layers' states side by side in layer order (None when off)."""
        if self.buffer is None:
            return None
        k, t, h = self.buffer.shape[0] - 1, self.buffer.shape[1], self.buffer.shape[2]
        return jnp.moveaxis(self.buffer[:k], 0, 1).reshape(t, k * h)

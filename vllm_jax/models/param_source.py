"""Where each of our params comes from in an HF checkpoint, and how to read any slice of it.

A param such as the stacked `layers/q_proj` [num_layers, hidden, q_size] is a grid of HF tensors over its
leading "stack" axes (one tensor per layer, or per layer and expert), each tensor holding the trailing dims,
possibly transposed (HF Linear weights are [out, in]; ours are [in, out]). Reading a slice of the param reads
only the matching slice of each HF tensor it covers, which is what sharded loading needs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class TensorReader(Protocol):
    """What a weight map reads through: a checkpoint's tensors by HF name, any slice of them (the loader's
    `Checkpoint`, model_loader/checkpoint.py, is one)."""

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray: ...


@dataclass(frozen=True)
class ParamSource:
    names: np.ndarray  # dtype=object, shape = the param's leading stack dims; () for a single tensor
    transpose: bool = False  # swap the two trailing dims (HF [out, in] -> [in, out])

    @property
    def stack_ndim(self) -> int:
        return self.names.ndim

    def hf_shape(self, param_shape: tuple[int, ...]) -> tuple[int, ...]:
        trailing = tuple(param_shape[self.stack_ndim:])
        return trailing[::-1] if self.transpose else trailing

    def needed(self, param_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """Every HF tensor the param is read from, with the shape the checkpoint must hold."""
        shape = self.hf_shape(param_shape)
        return {name: shape for name in self.names.flat}

    def read(self, checkpoint: TensorReader, index: tuple[slice, ...], param_shape: tuple[int, ...],
             dtype) -> np.ndarray:
        """The param's [index] slice, assembled from the HF tensors it covers."""
        index = tuple(index) + (slice(None),) * (len(param_shape) - len(index))
        stack_index, trailing = index[:self.stack_ndim], index[self.stack_ndim:]
        hf_index = trailing[::-1] if self.transpose else trailing
        ranges = [range(*s.indices(n)) for s, n in zip(stack_index, param_shape[:self.stack_ndim])]
        pieces = []
        for position in itertools.product(*ranges):
            tensor = checkpoint.read(self.names[position], hf_index)
            pieces.append((tensor.T if self.transpose else tensor).astype(dtype, copy=False))
        if not ranges:
            return pieces[0]
        return np.stack(pieces).reshape(*(len(r) for r in ranges), *pieces[0].shape)


def single(name: str, transpose: bool = False) -> ParamSource:
    return ParamSource(np.array(name, dtype=object), transpose)


def per_layer(template: str, num_layers: int | Sequence[int], transpose: bool = False) -> ParamSource:
    """`template` holds `{layer}`: one HF tensor per layer, stacked on axis 0. `num_layers` is a count (layers
    0..n-1) or the HF layer indices in stack order (params that exist only on some layers)."""
    return ParamSource(np.array([template.format(layer=i) for i in _layers(num_layers)], dtype=object), transpose)


def per_layer_expert(template: str, num_layers: int | Sequence[int], num_experts: int,
                     transpose: bool = False) -> ParamSource:
    """`template` holds `{layer}` and `{expert}`: one HF tensor per (layer, expert), stacked on axes 0 and 1."""
    names = [[template.format(layer=i, expert=e) for e in range(num_experts)] for i in _layers(num_layers)]
    return ParamSource(np.array(names, dtype=object).reshape(-1, num_experts), transpose)


def _layers(num_layers: int | Sequence[int]) -> list[int]:
    return list(range(num_layers)) if isinstance(num_layers, int) else [int(i) for i in num_layers]

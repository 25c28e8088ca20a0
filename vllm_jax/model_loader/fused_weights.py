"""A param read as a row range of a fused HF tensor (Phi-3's qkv_proj and gate_up_proj; Gemma 4's stacked
experts.gate_up_proj, and its experts.down_proj whole, both with their last two dims swapped).

The fused tensor is split at load: q, k, v (gate, up) are separate params, so the partition rules, the
quantized reads and the model code see Llama's layout. Each device reads only its slice of its part: the
part's output rows are shifted by the part's offset before the checkpoint read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_jax.model_loader.checkpoint import Checkpoint
from vllm_jax.model_loader.param_source import ParamSource, per_layer


@dataclass(frozen=True)
class FusedPartSource(ParamSource):
    """Rows offset .. offset + part of each HF tensor [fused_rows, in], transposed into the param [*stack, in,
    part]."""

    offset: int = 0
    fused_rows: int = 0

    def hf_shape(self, param_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The whole fused tensor's shape (what the checkpoint must hold)."""
        return (self.fused_rows,) + tuple(param_shape[self.stack_ndim:])[::-1][1:]

    def read(self, checkpoint: Checkpoint, index: tuple[slice, ...], param_shape: tuple[int, ...],
             dtype) -> np.ndarray:
        return super().read(_RowShifted(checkpoint, self.offset, param_shape[-1]), index, param_shape, dtype)


@dataclass(frozen=True)
class _RowShifted:
    """A checkpoint whose reads of dim 0 are shifted by `offset` (a slice of a part of `part_rows` rows)."""

    checkpoint: Checkpoint
    offset: int
    part_rows: int

    def read(self, name: str, index: tuple[slice, ...]) -> Any:
        start, stop, step = index[0].indices(self.part_rows)
        return self.checkpoint.read(name, (slice(start + self.offset, stop + self.offset, step),) + tuple(index[1:]))


def fused_part(template: str, num_layers: int, offset: int, fused_rows: int) -> FusedPartSource:
    """Per layer (`template` holds `{layer}`), rows offset .. of a fused [fused_rows, in] weight, transposed."""
    names = per_layer(template, num_layers, transpose=True).names
    return FusedPartSource(names, transpose=True, offset=offset, fused_rows=fused_rows)


@dataclass(frozen=True)
class ExpertPartSource(ParamSource):
    """Rows offset .. offset + part of each layer's stacked-expert HF tensor [E, fused_rows, in] (Gemma 4's
    experts.gate_up_proj / down_proj), its last two dims swapped into the param [layers, E, in, part]. A slice of
    the param reads only its experts, rows and columns (expert- and tensor-parallel loading)."""

    offset: int = 0
    fused_rows: int = 0

    def hf_shape(self, param_shape: tuple[int, ...]) -> tuple[int, ...]:
        experts, columns, _ = param_shape[1:]
        return (experts, self.fused_rows, columns)

    def read(self, checkpoint: Checkpoint, index: tuple[slice, ...], param_shape: tuple[int, ...],
             dtype) -> np.ndarray:
        layers, experts, columns, rows = tuple(index) + (slice(None),) * (4 - len(index))
        start, stop, step = rows.indices(param_shape[3])
        rows = slice(start + self.offset, stop + self.offset, step)
        pieces = [np.swapaxes(checkpoint.read(self.names[i], (experts, rows, columns)), -1, -2).astype(dtype)
                  for i in range(*layers.indices(param_shape[0]))]
        return np.stack(pieces)


def expert_part(template: str, layers: list[int], offset: int, fused_rows: int) -> ExpertPartSource:
    """Per layer (`template` holds `{layer}`), rows offset .. of a stacked-expert [E, fused_rows, in] tensor."""
    return ExpertPartSource(per_layer(template, layers).names, offset=offset, fused_rows=fused_rows)

"""Params and HF tensors that fuse differently. A param read as a row range of a fused HF tensor (Phi-3's
qkv_proj and gate_up_proj; Gemma 4's stacked experts.gate_up_proj, and its experts.down_proj whole, both with
their last two dims swapped): each device reads only its slice of its part, the part's output rows shifted by
the part's offset before the checkpoint read. And the other way round, one fused param read from several parts
(`FusedColumnsSource`: our `qkv_proj`, model/fused_projections.py), whatever each part's own
source is (a separate HF tensor, or a row range of Phi-3's fused one).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_jax.model.fused_projections import QKV, QKV_PARTS, FusedLayout, qkv_layout
from vllm_jax.models.param_source import ParamSource, TensorReader, per_layer


@dataclass(frozen=True)
class FusedPartSource(ParamSource):
    """Rows offset .. offset + part of each HF tensor [fused_rows, in], transposed into the param [*stack, in,
    part]."""

    offset: int = 0
    fused_rows: int = 0

    def hf_shape(self, param_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The whole fused tensor's shape (what the checkpoint must hold)."""
        return (self.fused_rows,) + tuple(param_shape[self.stack_ndim:])[::-1][1:]

    def read(self, checkpoint: TensorReader, index: tuple[slice, ...], param_shape: tuple[int, ...],
             dtype) -> np.ndarray:
        return super().read(_RowShifted(checkpoint, self.offset, param_shape[-1]), index, param_shape, dtype)


@dataclass(frozen=True)
class _RowShifted:
    """A checkpoint whose reads of dim 0 are shifted by `offset` (a slice of a part of `part_rows` rows)."""

    checkpoint: TensorReader
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

    def read(self, checkpoint: TensorReader, index: tuple[slice, ...], param_shape: tuple[int, ...],
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


@dataclass(frozen=True)
class FusedColumnsSource(ParamSource):
    """A fused param [*stack, in, layout.size] whose output columns interleave its parts' (`layout`); `names` is
    the grid [*stack, parts] of the parts' HF tensors, and `parts` each part's source with its names left to
    that grid's column (so narrowing `names` to some layers narrows every part). A slice of output columns reads
    only the columns of each part it covers."""

    layout: FusedLayout | None = None
    parts: tuple[ParamSource, ...] = ()

    @property
    def stack_ndim(self) -> int:
        return self.names.ndim - 1

    def part(self, p: int) -> ParamSource:
        """Part `p`'s source over this param's stack positions."""
        return dataclasses.replace(self.parts[p], names=self.names[..., p])

    def part_shape(self, param_shape: tuple[int, ...], p: int) -> tuple[int, ...]:
        return tuple(param_shape[:-1]) + (self.layout.part_size(p),)

    def hf_shape(self, param_shape: tuple[int, ...]) -> tuple[int, ...]:
        raise AssertionError("a fused param's parts have shapes of their own: use needed()")

    def needed(self, param_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        needed: dict[str, tuple[int, ...]] = {}
        for p in range(len(self.parts)):
            needed.update(self.part(p).needed(self.part_shape(param_shape, p)))
        return needed

    def read(self, checkpoint: TensorReader, index: tuple[slice, ...], param_shape: tuple[int, ...],
             dtype) -> np.ndarray:
        index = tuple(index) + (slice(None),) * (len(param_shape) - len(index))
        owner, within = self.layout.locate(np.arange(*index[-1].indices(param_shape[-1])))
        out = None
        for p in range(len(self.parts)):
            mine = owner == p
            if not mine.any():
                continue
            wanted = within[mine]
            lo, hi = int(wanted.min()), int(wanted.max()) + 1
            block = self.part(p).read(checkpoint, index[:-1] + (slice(lo, hi),), self.part_shape(param_shape, p),
                                      dtype)
            if out is None:
                out = np.empty(block.shape[:-1] + (len(owner),), block.dtype)
            out[..., mine] = block[..., wanted - lo]
        return out


def with_fused_params(sources: dict[tuple[str, ...], ParamSource],
                      spec: Any) -> dict[tuple[str, ...], ParamSource]:
    """`sources` plus the fused `layers/qkv_proj` read from its parts' sources, for the models built with it (the
    loader reads the entries a model's param tree has)."""
    parts = [sources.get(("layers", part)) for part in QKV_PARTS]
    if any(p is None for p in parts):
        return sources
    names = np.stack([p.names for p in parts], axis=-1)
    return {**sources, ("layers", QKV): FusedColumnsSource(names, layout=qkv_layout(spec), parts=tuple(parts))}

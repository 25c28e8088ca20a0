"""q/k/v and gate/up as one weight each (`qkv_proj`, `gate_up_proj`): one dot per layer where there were three and
two, so a step reads the activations once per group and an accelerator compiles and launches fewer kernels
(docs/architecture/06-model.md, "Fused projections").

The fused weight's output columns are `units` groups, each holding every part's slice in order: for q/k/v a unit is
one KV head (its q heads, then its k, then its v), for gate/up a unit is one of `num_kv_heads` equal blocks of the
intermediate dim (its gate block, then its up block). Split over tensor-parallel devices on the output dim, each
device then holds whole units, so the same layout serves every tp that divides the KV heads (and no checkpoint or
converted directory depends on tp). A part's own columns, in the part's order, are the unit-major concatenation of
its slices: `split` returns exactly the separate projections' outputs.

Plain float weights only (`fusion_for`): quantized weights (their scales, a GGUF file's per-tensor formats) and
meshes whose tp does not divide the KV heads (the KV projections are then replicated while q is split) keep the
separate params.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

QKV, GATE_UP = "qkv_proj", "gate_up_proj"
# fused param -> its parts, in column order within a unit; and part -> the fused param it lives in
FUSED_PARTS = {QKV: ("q_proj", "k_proj", "v_proj"), GATE_UP: ("gate_proj", "up_proj")}
FUSED_PARENT = {part: fused for fused, parts in FUSED_PARTS.items() for part in parts}


@dataclass(frozen=True)
class FusedLayout:
    """The output columns of one fused linear: `units` groups of `widths` columns per part (`parts` in order)."""

    name: str
    parts: tuple[str, ...]
    widths: tuple[int, ...]
    units: int

    @property
    def unit_width(self) -> int:
        return sum(self.widths)

    @property
    def size(self) -> int:
        return self.units * self.unit_width

    def part_size(self, part: int) -> int:
        return self.units * self.widths[part]

    def split(self, y: jax.Array) -> list[jax.Array]:
        """[..., size] -> each part's [..., part_size], as the separate projection would give it."""
        lead = y.shape[:-1]
        grouped = y.reshape(*lead, self.units, self.unit_width)
        out, start = [], 0
        for width in self.widths:
            out.append(grouped[..., start:start + width].reshape(*lead, self.units * width))
            start += width
        return out

    def join(self, parts: list[jax.Array]) -> jax.Array:
        """The inverse of `split`: each part's [..., part_size] -> [..., size]."""
        lead = parts[0].shape[:-1]
        grouped = [p.reshape(*lead, self.units, w) for p, w in zip(parts, self.widths)]
        return jnp.concatenate(grouped, axis=-1).reshape(*lead, self.size)

    def columns(self, part: int) -> np.ndarray:
        """The fused columns of part `part`'s columns 0 .. part_size (int64, in the part's order)."""
        width = self.widths[part]
        offset = sum(self.widths[:part])
        unit, within = np.divmod(np.arange(self.part_size(part)), width)
        return unit * self.unit_width + offset + within


def qkv_layout(spec: Any) -> FusedLayout:
    kv = spec.num_kv_heads
    return FusedLayout(QKV, FUSED_PARTS[QKV],
                       (spec.q_size // kv, spec.kv_size // kv, spec.kv_size // kv), kv)


def gate_up_layout(spec: Any) -> FusedLayout:
    kv = spec.num_kv_heads
    return FusedLayout(GATE_UP, FUSED_PARTS[GATE_UP], (spec.intermediate_size // kv,) * 2, kv)


@dataclass(frozen=True)
class Fusion:
    """Which of a model's linears are fused (static, fixed when the model is built)."""

    qkv: bool = False
    gate_up: bool = False


NO_FUSION = Fusion()


def fusion_for(spec: Any, quantization: Any, tp: int) -> Fusion:
    """Fused layouts for plain float weights when `tp` divides the KV heads (gate/up also needs the KV heads to
    divide the intermediate dim); none with any quantization."""
    if quantization is not None or spec.num_kv_heads % tp or spec.q_size % spec.num_kv_heads:
        return Fusion()
    return Fusion(qkv=True, gate_up=spec.intermediate_size % spec.num_kv_heads == 0)


def layout_of(spec: Any, name: str) -> FusedLayout:
    return qkv_layout(spec) if name == QKV else gate_up_layout(spec)

"""q/k/v as one weight (`qkv_proj`): one dot per layer where there were three, so a step reads the activations
once and an accelerator compiles and launches one kernel where it had three (docs/architecture/06-model.md,
"Fused projections"). gate/up stay two weights: measured, fusing them made XLA write their whole [T, 2I] product
out at large token buckets (twice the temporaries), where separately it fuses up's dot into down's.

The fused weight's output columns are `units` groups, each holding every part's slice in order: a unit is one KV
head (its query heads, then its k, then its v). Split over tensor-parallel devices on the output dim, each device
then holds whole units, so the same layout serves every tp that divides the KV heads (and no checkpoint or
converted directory depends on tp). A part's own columns, in the part's order, are the unit-major concatenation of
its slices: `split` returns exactly the separate projections' outputs.

Plain float weights only (`fuses_qkv`): quantized weights (their scales, a GGUF file's per-tensor formats) and
meshes whose tp does not divide the KV heads (the KV projections are then replicated while q is split) keep the
separate params.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

QKV = "qkv_proj"
QKV_PARTS = ("q_proj", "k_proj", "v_proj")


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
        xp = np if all(isinstance(p, np.ndarray) for p in parts) else jnp  # host arrays stay on the host
        return xp.concatenate(grouped, axis=-1).reshape(*lead, self.size)

    def columns(self, part: int) -> np.ndarray:
        """The fused columns of part `part`'s columns 0 .. part_size (int64, in the part's order)."""
        width = self.widths[part]
        offset = sum(self.widths[:part])
        unit, within = np.divmod(np.arange(self.part_size(part)), width)
        return unit * self.unit_width + offset + within

    def locate(self, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The inverse of `columns`: for fused columns, (the part each belongs to, its column in that part)."""
        unit, within_unit = np.divmod(columns, self.unit_width)
        offsets = np.cumsum((0,) + self.widths[:-1])
        part = np.searchsorted(offsets, within_unit, side="right") - 1
        return part, unit * np.asarray(self.widths)[part] + within_unit - offsets[part]


def qkv_layout(spec: Any) -> FusedLayout:
    kv = spec.num_kv_heads
    return FusedLayout(QKV, QKV_PARTS, (spec.q_size // kv, spec.kv_size // kv, spec.kv_size // kv), kv)


def fuses_qkv(spec: Any, quantization: Any, tp: int) -> bool:
    """q/k/v fused for plain float weights when `tp` divides the KV heads; never with any quantization."""
    return quantization is None and spec.num_kv_heads % tp == 0 and spec.q_size % spec.num_kv_heads == 0

"""gpt-oss's published MXFP4 experts (`quant_method: mxfp4`), dequantized to float as they are read
(docs/architecture/12-families.md, "gpt-oss").

The layout, as transformers' integrations/mxfp4.py reads it: each fused expert weight `X` (`gate_up_proj`,
`down_proj`) is stored as
    X_blocks  uint8 [E, out, in / 32, 16]   two e2m1 codes a byte, element 2k in the low nibble, 2k + 1 high
    X_scales  uint8 [E, out, in / 32]       one e8m0 exponent per 32 inputs: 2 ** (byte - 127)
and dequantizes to [E, out, in], which transposed is the float checkpoint's X [E, in, out]. `Mxfp4Checkpoint`
shows the float tensor X in that layout, so the gpt-oss weight map reads it like a float checkpoint's; a slice
reads only the blocks of its own rows and 32-input groups (per device shard). Keeping MXFP4 packed on the
device is not built: the experts take the model dtype's bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint

# e2m1: sign bit 3, then exponent / mantissa; the codes 0..15 as values
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                       np.float32)
GROUP = 32  # inputs per e8m0 scale
E8M0_BIAS = 127
_BLOCKS, _SCALES = "_blocks", "_scales"


def is_mxfp4_checkpoint(model_dir: str | Path) -> bool:
    """Whether config.json's quantization_config says MXFP4 (gpt-oss's published experts)."""
    try:
        raw = json.loads((Path(model_dir) / "config.json").read_text()).get("quantization_config")
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(raw, dict) and raw.get("quant_method") == "mxfp4"


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """uint8 blocks [..., G, 16] and scales [..., G] -> float32 [..., G * 32] (element order along the input)."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 2 * blocks.shape[-1])
    exponents = scales.astype(np.int32)[..., None] - E8M0_BIAS
    return np.ldexp(E2M1_VALUES[codes], exponents).reshape(*scales.shape[:-1], -1)


class Mxfp4Checkpoint:
    """A safetensors checkpoint whose `X_blocks` / `X_scales` pairs read as the float tensor X [E, in, out]."""

    def __init__(self, inner: SafetensorsCheckpoint):
        self.inner, self.path = inner, inner.path
        available = inner.names()
        self._packed: dict[str, tuple[str, str]] = {}
        for name in sorted(available):
            if name.endswith(_BLOCKS) or name.endswith(_SCALES):
                base = name.removesuffix(_BLOCKS).removesuffix(_SCALES)
                pair = (base + _BLOCKS, base + _SCALES)
                missing = [n for n in pair if n not in available]
                if missing:
                    raise ModelSourceError(f"{inner.where(name)}: MXFP4 tensor {name!r} has no {missing[0]!r}")
                self._packed[base] = pair
        for base in self._packed:
            self._check(base)
        hidden = {n for pair in self._packed.values() for n in pair}
        self._names = (available - hidden) | set(self._packed)

    def _check(self, base: str) -> None:
        blocks, scales = self._packed[base]
        b_shape, s_shape = self.inner.shape(blocks), self.inner.shape(scales)
        for name, want in ((blocks, "U8"), (scales, "U8")):
            if self.inner.dtype(name) != want:
                raise ModelSourceError(f"{self.inner.where(name)}: MXFP4 tensor {name!r} is stored as "
                                       f"{self.inner.dtype(name)}, expected U8")
        if len(b_shape) != 4 or b_shape[-1] != GROUP // 2 or b_shape[:-1] != s_shape:
            raise ModelSourceError(f"{self.inner.where(blocks)}: MXFP4 blocks {blocks!r} {b_shape} and scales "
                                   f"{scales!r} {s_shape} do not match: expected blocks [experts, out, in / 32, 16] "
                                   "and scales [experts, out, in / 32]")

    # ---- the Checkpoint protocol ---------------------------------------------------------------------------

    def names(self) -> set[str]:
        return set(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._packed:
            return self.inner.shape(name)
        experts, out, groups, _ = self.inner.shape(self._packed[name][0])
        return (experts, groups * GROUP, out)

    def where(self, name: str) -> str:
        return self.inner.where(self._packed[name][0] if name in self._packed else name)

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """X[index] (float32, [E, in, out] layout): only the blocks of the sliced experts, outputs and the
        32-input groups covering the sliced inputs are read."""
        if name not in self._packed:
            return self.inner.read(name, index)
        shape = self.shape(name)
        experts, inputs, outputs = (tuple(index) + (slice(None),) * 3)[:3]
        start, stop, step = inputs.indices(shape[1])
        first, last = start // GROUP, -(-stop // GROUP)
        blocks, scales = self._packed[name]
        packed = (experts, outputs, slice(first, last))
        values = dequantize_mxfp4(self.inner.read(blocks, packed), self.inner.read(scales, packed))
        values = values[..., start - first * GROUP:stop - first * GROUP:step]  # [E, out, in]
        return np.ascontiguousarray(values.swapaxes(-1, -2))

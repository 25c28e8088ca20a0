"""A pre-quantized safetensors checkpoint as a `Checkpoint`, and the reads that keep its values' bits.

`PrequantizedCheckpoint` hides each `weight_scale` / `weight_scale_inv` behind its weight: `read` of a quantized
weight returns it dequantized (values x scale, float32), which is what every param outside QUANTIZED_LINEARS and
a model built without quantization need. The linears kept quantized read their stored values and per-channel
scales through `StoredQuantizedReads` instead: a channel scale [out, 1] is taken as is, a tensor scale is
broadcast over out, a [b_out x b_in] block scale becomes a grouped scale [in // g, out] (repeated over its output
rows: model/quantization.py), all exact, and the int8 / fp8 bits are placed untouched. MoE experts keep
per-channel scales, so a block-scaled expert has no exact form: the tensor loader requantizes its dequantized
values per channel (`QuantizedReads`; docs/architecture/06-model.md, "Quantized weights").

`check` runs before any read: every scale matches its weight, every quantized linear has a scale, every stored
int8 / fp8 tensor has one: one ModelSourceError naming the tensor otherwise.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from vllm_jax.model.quantization import SCHEMES
from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.prequantized import PrequantizedConfig
from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint
from vllm_jax.model_loader.weight_loader import ParamPath
from vllm_jax.models.param_source import ParamSource

_STORED_DTYPE = {"int8": "I8", "fp8": "F8_E4M3"}  # safetensors' names of our schemes' storage dtypes
_WEIGHT = ".weight"


class PrequantizedCheckpoint:
    """The checkpoint's tensors under their HF names; a quantized weight reads dequantized, its scale is hidden."""

    def __init__(self, inner: SafetensorsCheckpoint, config: PrequantizedConfig):
        self.inner, self.config, self.path = inner, config, inner.path
        available = inner.names()
        self._scale_of = {name: name[:-len(_WEIGHT)] + "." + config.scale_suffix for name in available
                          if name.endswith(_WEIGHT) and name[:-len(_WEIGHT)] + "." + config.scale_suffix in available}
        self._names = available - set(self._scale_of.values())

    # ---- the Checkpoint protocol ---------------------------------------------------------------------------

    def names(self) -> set[str]:
        return set(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.inner.shape(name)

    def where(self, name: str) -> str:
        return self.inner.where(name)

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The tensor's [index] slice; a quantized weight dequantized to float32."""
        if name not in self._scale_of:
            return self.inner.read(name, index)
        values = self.inner.read(name, index).astype(np.float32)
        return values * self._scale_at(name, index)

    # ---- stored values and scales ----------------------------------------------------------------------------

    def read_values(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """The stored int8 / fp8 values, bit for bit."""
        return self.inner.read(name, index)

    def layout(self, name: str) -> str | None:
        """How `name`'s scale is laid out (channel / tensor / block), or None for a tensor stored unquantized."""
        if name not in self._scale_of:
            return None
        shape = self.inner.shape(self._scale_of[name])
        if shape in ((), (1,)):
            return "tensor"
        out = self.inner.shape(name)[0]
        if shape in ((out, 1), (out,)) and "channel" in self.config.strategies:
            return "channel"
        return "block"

    def channel_scales(self, name: str) -> np.ndarray:
        """float32 [out]: a channel scale as stored, a tensor scale repeated over the output channels."""
        out = self.inner.shape(name)[0]
        scale = self.inner.read(self._scale_of[name], ()).astype(np.float32)
        return np.broadcast_to(scale.reshape(-1), (out,)).copy() if scale.size == 1 else scale.reshape(out)

    def grouped_scales(self, name: str, groups: int) -> np.ndarray:
        """float32 [groups, out]: the scale of each run of in // groups input rows and output channel (a block
        scale repeated over its output rows and the groups inside it; a channel or tensor scale over the groups)."""
        out, inp = self.inner.shape(name)
        rows = np.arange(out)
        cols = np.arange(groups) * (inp // groups)
        return np.ascontiguousarray(self._scale_at(name, (rows, cols), outer=True).T)

    def _scale_at(self, name: str, index: tuple, outer: bool = False) -> np.ndarray:
        """The scale of the weight's [index] elements (slices; with `outer`, row and column index arrays),
        broadcastable to them: no [out, in] copy of a block scale is made."""
        out, inp = self.inner.shape(name)
        rows, cols = (index if outer else
                      tuple(np.arange(n)[i] for i, n in zip(tuple(index) + (slice(None),) * 2, (out, inp))))
        scale = self.inner.read(self._scale_of[name], ()).astype(np.float32)
        if self.layout(name) == "block":
            b_out, b_in = self.config.block
            return scale[np.ix_(rows // b_out, cols // b_in)]
        if scale.size == 1:
            return np.broadcast_to(scale.reshape(1, 1), (len(rows), len(cols)))
        return np.broadcast_to(scale.reshape(-1, 1)[rows], (len(rows), len(cols)))

    # ---- checks, before any read -----------------------------------------------------------------------------

    def check(self, quantized: dict[ParamPath, ParamSource], grouped: set[ParamPath]) -> set[ParamPath]:
        """Validate every scale and stored dtype; `quantized`: the params our model keeps quantized, by source;
        `grouped`: those with grouped scales. -> those whose tensors keep their stored bits (grouped params, and
        channel / tensor scales); the rest (block scales under per-channel ones: MoE experts) are requantized per
        channel from their dequantized values."""
        for name, scale_name in sorted(self._scale_of.items()):
            self._check_scale(name, scale_name)
        for name in sorted(self._names - set(self._scale_of)):
            if self.inner.dtype(name) in _STORED_DTYPE.values():
                raise ModelSourceError(f"{self.where(name)}: tensor {name!r} is stored as {self.inner.dtype(name)} "
                                       f"but the checkpoint has no {name[:-len(_WEIGHT)]}.{self.config.scale_suffix}"
                                       f" for it ({self.config.describe()})")
        stored = set()
        for path, src in quantized.items():
            layouts = set()
            for name in src.names.flat:
                module = name[:-len(_WEIGHT)]
                if name not in self._scale_of:
                    if self.config.is_ignored(module):
                        raise ModelSourceError(
                            f"{self.where(name)}: {module} is on the quantization_config's ignore list (stored in "
                            "float), but every layer's q/k/v/o and gate/up/down (and MoE experts) are kept "
                            "quantized here; a checkpoint that leaves some of them float is not supported")
                    raise ModelSourceError(f"{self.where(name)}: tensor {name!r} has no scale "
                                           f"{module}.{self.config.scale_suffix} ({self.config.describe()})")
                layouts.add(self.layout(name))
            if path in grouped or "block" not in layouts:
                stored.add(path)
        return stored

    def _check_scale(self, name: str, scale_name: str) -> None:
        weight_shape, scale_shape = self.inner.shape(name), self.inner.shape(scale_name)
        dtype, want = self.inner.dtype(name), _STORED_DTYPE[self.config.scheme]
        if dtype != want:
            raise ModelSourceError(f"{self.where(name)}: tensor {name!r} is stored as {dtype}; "
                                   f"{self.config.describe()} stores {want}")
        if len(weight_shape) != 2:
            raise ModelSourceError(f"{self.where(name)}: quantized tensor {name!r} has shape {weight_shape}; only "
                                   "2-D linear weights [out, in] are read quantized")
        expected = self._expected_scale_shapes(weight_shape)
        if scale_shape not in expected:
            raise ModelSourceError(f"{self.where(scale_name)}: scale {scale_name!r} has shape {scale_shape}, which "
                                   f"does not match weight {name!r} of shape {weight_shape} (expected "
                                   f"{' or '.join(map(str, expected))} for {self.config.describe()})")

    def _expected_scale_shapes(self, weight_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        out, inp = weight_shape
        shapes: list[tuple[int, ...]] = []
        if "channel" in self.config.strategies:
            shapes += [(out, 1), (out,)]
        if "tensor" in self.config.strategies:
            shapes += [(1,), ()]
        if "block" in self.config.strategies:
            b_out, b_in = self.config.block
            shapes.append((math.ceil(out / b_out), math.ceil(inp / b_in)))
        return shapes


class StoredQuantizedReads:
    """One kept-quantized weight's device slices straight from the checkpoint: `values(index)` [*stack, in, out]
    in the stored int8 / fp8 bits, `scales(index)` [*stack, out] float32 (channel scales as stored, a tensor's
    scale broadcast). The same callbacks as `tensor_loader.QuantizedReads`, without a float copy or rounding."""

    def __init__(self, checkpoint: PrequantizedCheckpoint, src: ParamSource, shape: tuple[int, ...], scheme: str,
                 groups: int | None = None):
        self.checkpoint, self.src, self.shape, self.groups = checkpoint, src, shape, groups
        self.dtype = SCHEMES[scheme].dtype

    def values(self, index: tuple[slice, ...]) -> np.ndarray:
        return self.src.read(_StoredValues(self.checkpoint), index, self.shape, self.dtype)

    def scales(self, index: tuple[slice, ...]) -> np.ndarray:
        """[*stack, out] per channel, or [*stack, groups, out] grouped, for `index`."""
        trailing = 1 if self.groups is None else 2
        index = tuple(index) + (slice(None),) * (len(self.shape) - 2 + trailing - len(index))
        stack_index, own_index = index[:-trailing], index[-trailing:]
        ranges = [range(*s.indices(n)) for s, n in zip(stack_index, self.shape[:-2])]
        pieces = []
        for position in itertools.product(*ranges):
            name = self.src.names[position]
            scale = (self.checkpoint.channel_scales(name) if self.groups is None
                     else self.checkpoint.grouped_scales(name, self.groups))
            pieces.append(scale[own_index])
        if not ranges:
            return pieces[0]
        return np.stack(pieces).reshape(*(len(r) for r in ranges), *pieces[0].shape)


class _StoredValues:
    """The checkpoint as `ParamSource.read` sees it, reading stored values instead of dequantized ones."""

    def __init__(self, checkpoint: PrequantizedCheckpoint):
        self.checkpoint = checkpoint

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        return self.checkpoint.read_values(name, index)

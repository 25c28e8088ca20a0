"""HF-named tensors -> params: the loader for safetensors shards and GGUF files alike.

Each param is created with `jax.make_array_from_callback`: every device asks for its own slice, and the
param's `ParamSource` (from the architecture's weight map) reads just that slice of the HF tensors behind it,
cast to the target dtype. So no device needs a full host copy of the model. The whole checkpoint is checked
before any read: a missing, unexpected or mis-shaped tensor is one `ModelSourceError` naming the file and
the tensor. Loading never executes code: safetensors and GGUF only, no pickle, no remote code.

With `--quantization`, a linear weight with a `_scale` sibling is quantized on the host as it is read
(`QuantizedReads`): a device's slice of output channels is read over every input row (a channel's scale needs
them all; a row-parallel weight's device thus reads its layers' whole matrix), one layer at a time in float32,
and only the int8 / fp8 values and the scales reach the device. No float copy of a quantized weight is placed.
The embedding [V, H] (online quantization only) is quantized per vocab row the same way (`TableQuantizedReads`): a
device's slice of rows, over all of H.

A pre-quantized checkpoint (`prequantized_checkpoint.PrequantizedCheckpoint`) is checked as a whole first; its
linears are placed with their stored bits and their scales as per-channel or grouped ones (`StoredQuantizedReads`),
except block-scaled MoE experts (per-channel scales only), requantized from their dequantized values
(`QuantizedReads`).
"""

from __future__ import annotations

import itertools

import jax
import numpy as np

from vllm_jax.model.quantization import EMBEDDING, SCALE_SUFFIX, SCHEMES, quantize, quantize_table
from vllm_jax.model_loader.checkpoint import Checkpoint
from vllm_jax.model_loader.param_source import ParamSource
from vllm_jax.model_loader.prequantized_checkpoint import PrequantizedCheckpoint, StoredQuantizedReads
from vllm_jax.model_loader.source import ModelSourceError
from vllm_jax.model_loader.weight_loader import NP_DTYPES, LoadRequest, ParamPath
from vllm_jax.model_loader.weight_maps import param_sources

# A tied model's checkpoint may still carry lm_head.weight; old ones carry rotary tables. Neither is read. A
# classifier's score.weight is the pooling runner's head, read apart (pooling/device/pooling_step.py).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_IGNORED_NAMES = ("lm_head.weight", "score.weight")


class TensorLoader:
    """Params read from a `Checkpoint` through the architecture's weight map."""

    def __init__(self, checkpoint: Checkpoint):
        self.checkpoint = checkpoint

    def load(self, request: LoadRequest) -> dict[ParamPath, jax.Array]:
        sources = {path: src for path, src in param_sources(request.spec).items() if path in request.shapes}
        scales = {path: _scale_path(path) for path in sources if _scale_path(path) in request.shapes}
        unmapped = sorted(set(request.shapes) - set(sources) - set(scales.values()))
        if unmapped:
            raise AssertionError(f"model params without a checkpoint mapping: {unmapped}")
        check_checkpoint(self.checkpoint, sources, request.shapes)
        return self.read_params(request, sources)

    def read_params(self, request: LoadRequest, sources: dict[ParamPath, ParamSource]) -> dict[ParamPath, jax.Array]:
        """The params of `sources` (and their scales, when `request.shapes` has them), read and placed; the
        checkpoint is already checked. Weight updates (worker/weight_update.py) call it for the params an update
        names, with `sources` narrowed to the layers it holds."""
        scales = {path: _scale_path(path) for path in sources if _scale_path(path) in request.shapes}
        stored: set[ParamPath] = set()
        # a scale with its values' rank is grouped ([*stack, in // g, out]: model/quantization.py); the embedding's
        # [V, 1] row scales are not
        tables = {path for path in scales if path == (EMBEDDING,)}
        grouped = {path for path, scale in scales.items()
                   if len(request.shapes[scale]) == len(request.shapes[path]) and path not in tables}
        if isinstance(self.checkpoint, PrequantizedCheckpoint):
            stored = self.checkpoint.check({path: sources[path] for path in scales}, grouped)
        elif grouped:
            raise AssertionError(f"grouped scales are read from pre-quantized checkpoints only: {sorted(grouped)}")
        np_dtype = NP_DTYPES[request.dtype]
        arrays = {}
        for path, src in sources.items():
            shape = request.shapes[path]
            if path in scales:
                scale_shape = request.shapes[scales[path]]
                if path in stored:
                    reads = StoredQuantizedReads(self.checkpoint, src, shape, request.quantization,
                                                 scale_shape[-2] if path in grouped else None)
                elif path in tables:
                    reads = TableQuantizedReads(self.checkpoint, src, shape, request.quantization)
                else:
                    reads = QuantizedReads(self.checkpoint, src, shape, request.quantization)
                arrays[path] = jax.make_array_from_callback(shape, request.sharding_for(path, shape), reads.values)
                arrays[scales[path]] = jax.make_array_from_callback(
                    scale_shape, request.sharding_for(scales[path], scale_shape), reads.scales)
                continue
            arrays[path] = jax.make_array_from_callback(
                shape, request.sharding_for(path, shape),
                lambda index, src=src, shape=shape: src.read(self.checkpoint, index, shape, np_dtype))
        return arrays


def ignored_tensor(name: str) -> bool:
    """A tensor a checkpoint may carry that no param reads (a tied model's lm_head.weight, rotary tables)."""
    return name.endswith(_IGNORED_SUFFIXES) or name in _IGNORED_NAMES


def _scale_path(path: ParamPath) -> ParamPath:
    return path[:-1] + (path[-1] + SCALE_SUFFIX,)


class QuantizedReads:
    """One quantized weight's device slices: `values(index)` for the values [*stack, in, out], `scales(index)` for
    the scales [*stack, out]. Each slice of stack positions and output channels is read and quantized once (the
    values' and the scales' callbacks, and devices that differ only in their input rows, share it), layer by layer
    in float32."""

    def __init__(self, checkpoint: Checkpoint, src: ParamSource, shape: tuple[int, ...], scheme: str | None):
        if scheme not in SCHEMES:
            raise AssertionError(f"a quantized param needs a quantization scheme; got {scheme!r}")
        self.checkpoint, self.src, self.shape, self.scheme = checkpoint, src, shape, scheme
        self._done: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def values(self, index: tuple[slice, ...]) -> np.ndarray:
        index = _full_index(index, len(self.shape))
        values, _ = self._quantized(index[:-2] + index[-1:])
        return values[..., index[-2], :]

    def scales(self, index: tuple[slice, ...]) -> np.ndarray:
        return self._quantized(_full_index(index, len(self.shape) - 1))[1]

    def _quantized(self, stack_and_out: tuple[slice, ...]) -> tuple[np.ndarray, np.ndarray]:
        dims = self.shape[:-2] + self.shape[-1:]
        ranges = [range(*s.indices(n)) for s, n in zip(stack_and_out, dims)]
        key = tuple((r.start, r.stop, r.step) for r in ranges)
        if key not in self._done:
            *stack, out = ranges
            values = np.empty([len(r) for r in stack] + [self.shape[-2], len(out)], SCHEMES[self.scheme].dtype)
            scales = np.empty([len(r) for r in stack] + [len(out)], np.float32)
            for local, position in zip(itertools.product(*(range(len(r)) for r in stack)),
                                       itertools.product(*stack)):
                one = tuple(slice(p, p + 1) for p in position) + (slice(None), stack_and_out[-1])
                w = self.src.read(self.checkpoint, one, self.shape, np.float32)[(0,) * len(position)]
                values[local], scales[local] = quantize(w, self.scheme)
            self._done[key] = (values, scales)
        return self._done[key]


class TableQuantizedReads:
    """The embedding's device slices under online quantization: `values(index)` [V, H], `scales(index)` [V, 1],
    one scale per vocab row. A device's slice of rows is read over all of H (a row's scale needs it) in float32,
    quantized once on the host and shared by the values' and the scales' callbacks."""

    def __init__(self, checkpoint: Checkpoint, src: ParamSource, shape: tuple[int, ...], scheme: str | None):
        if scheme not in SCHEMES or len(shape) != 2:
            raise AssertionError(f"a quantized table needs a scheme and a [V, H] shape; got {scheme!r}, {shape}")
        self.checkpoint, self.src, self.shape, self.scheme = checkpoint, src, shape, scheme
        self._done: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def values(self, index: tuple[slice, ...]) -> np.ndarray:
        index = _full_index(index, 2)
        return self._quantized(index[0])[0][:, index[1]]

    def scales(self, index: tuple[slice, ...]) -> np.ndarray:
        return self._quantized(_full_index(index, 2)[0])[1]

    def _quantized(self, rows: slice) -> tuple[np.ndarray, np.ndarray]:
        key = rows.indices(self.shape[0])
        if key not in self._done:
            table = self.src.read(self.checkpoint, (rows, slice(None)), self.shape, np.float32)
            self._done[key] = quantize_table(table, self.scheme)
        return self._done[key]


def _full_index(index: tuple[slice, ...], ndim: int) -> tuple[slice, ...]:
    return tuple(index) + (slice(None),) * (ndim - len(index))


def check_checkpoint(checkpoint: Checkpoint, sources: dict[ParamPath, ParamSource],
                     shapes: dict[ParamPath, tuple[int, ...]]) -> None:
    """Every needed tensor present with the shape the config implies; nothing unexpected."""
    available = checkpoint.names()
    needed: dict[str, tuple[int, ...]] = {}
    for path, src in sources.items():
        needed.update(src.needed(shapes[path]))
    missing = sorted(set(needed) - available)
    if missing:
        raise ModelSourceError(f"{checkpoint.path}: checkpoint lacks {len(missing)} tensor(s) the model needs, "
                               f"e.g. {', '.join(missing[:5])}")
    unexpected = sorted(n for n in available - set(needed) if not ignored_tensor(n))
    if unexpected:
        raise ModelSourceError(f"{checkpoint.where(unexpected[0])}: unexpected tensor(s) for this architecture: "
                               f"{', '.join(unexpected[:5])}")
    for name, shape in needed.items():
        got = checkpoint.shape(name)
        if got != shape:
            raise ModelSourceError(f"{checkpoint.where(name)}: tensor {name!r} has shape {got} but the config "
                                   f"implies {shape}")

"""Weight updates in place: HF-named tensors (or a checkpoint directory) -> the runner's params, nothing recompiled.

An update is read through the loader's own rules: the architecture's weight map (`models/registry.py param_sources`)
says which param and which layer each HF tensor feeds, and `TensorLoader.read_params` does the transposes, fused
splits, dtype casts and `--quantization` (int8 / fp8 scales recomputed from the float update) exactly as loading
does. Every new array is placed on the sharding of the array it replaces, so the compiled programs keep running
(docs/architecture/05-worker.md, "Sleep and weight updates").

A param kept in GGUF blocks (`--quantization gguf`) gets the update quantized by gguf-py's rule, the one the
file's own blocks were made by (model_loader/gguf_file/requantize.py), or, from a GGUF path storing it in the
kept format, the file's blocks as loading takes them.

Everything is checked before anything changes: an unknown name, a wrong shape, a param fed only in part (one of
Phi-3's fused parts, one expert of a layer), float tensors for a K-quant kept param (gguf-py cannot quantize
Q4_K / Q6_K), or float tensors for a pre-quantized checkpoint's grouped (block-fp8) scales is a ValueError
naming it. Then each param is read, placed and swapped in turn (peak memory: one param more). An update may name
some params only, and some layers of a param only.
jax.Arrays that need no transpose or cast and already have the param's sharding are used as they are, without a
copy; other jax.Arrays are transposed and cast on their devices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from vllm_jax.model.grouped_quant import min_name, packed
from vllm_jax.model.quantization import EMBEDDING, SCALE_SUFFIX, KeptFormats, scheme_name
from vllm_jax.model_loader.checkpoint import Checkpoint
from vllm_jax.model_loader.gguf_file import GGUFCheckpoint
from vllm_jax.model_loader.gguf_file.kept import stored_format, stored_parts
from vllm_jax.model_loader.gguf_file.requantize import QUANTIZABLE, quantized_parts
from vllm_jax.model_loader.loader import checkpoint_for, model_quantization
from vllm_jax.model_loader.prequantized_checkpoint import PrequantizedCheckpoint
from vllm_jax.model_loader.source import resolve_model_source
from vllm_jax.model_loader.tensor_loader import TensorLoader, ignored_tensor
from vllm_jax.model_loader.weight_loader import NP_DTYPES, LoadRequest, ParamPath
from vllm_jax.models.fused_weights import FusedColumnsSource
from vllm_jax.models.param_source import ParamSource
from vllm_jax.models.registry import param_sources

Weights = Iterable[tuple[str, Any]] | str | Path


class ArrayCheckpoint:
    """(HF name, array) pairs as a `Checkpoint`: numpy, jax or torch arrays, read by slice like a file's."""

    path = "update_weights"

    def __init__(self, pairs: Iterable[tuple[str, Any]]):
        self.arrays: dict[str, Any] = {}
        for name, array in pairs:
            if not isinstance(name, str):
                raise ValueError(f"update_weights takes (name, array) pairs; got a {type(name).__name__} name")
            self.arrays[name] = _as_array(name, array)
        self._host: dict[str, np.ndarray] = {}

    def names(self) -> set[str]:
        return set(self.arrays)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.arrays[name].shape)

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        if name not in self._host:  # a jax array is copied to the host once, whatever slices the devices ask
            self._host[name] = np.asarray(self.arrays[name])
        return self._host[name][index]

    def where(self, name: str) -> str:
        return f"update_weights ({name})"


def _as_array(name: str, array: Any) -> Any:
    """numpy and jax arrays as they are; a torch tensor as numpy (bfloat16 through its bits: numpy has none)."""
    if isinstance(array, (np.ndarray, jax.Array)):
        return array
    if type(array).__module__.startswith("torch"):
        tensor = array.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            import torch

            return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return tensor.numpy()
    if isinstance(array, (list, tuple, float, int)):
        return np.asarray(array)
    raise ValueError(f"update_weights: {name!r} is a {type(array).__name__}, not a numpy, jax or torch array")


def as_checkpoint(weights: Weights) -> Checkpoint:
    """What `update_weights` reads: a checkpoint directory or GGUF file by path, else (name, array) pairs."""
    if isinstance(weights, (str, Path)):
        source = resolve_model_source(str(weights))
        if source.kind not in ("hf", "gguf"):
            raise ValueError(f"update_weights reads safetensors directories and GGUF files; {weights} is neither")
        return checkpoint_for(source)
    if isinstance(weights, dict):
        weights = weights.items()
    return ArrayCheckpoint(weights)


@dataclasses.dataclass(frozen=True)
class _ParamUpdate:
    """One param an update feeds: its path, its source narrowed to the stack positions (layers) fed."""

    path: ParamPath
    src: ParamSource
    positions: list[int] | None  # along the stack axis 0; None: a param without a stack, or every position
    from_device: bool  # every tensor a jax.Array and a plain read: transposed / cast on its devices
    kept: str | None = None  # the GGUF format the param is kept in (--quantization gguf), else None


class WeightUpdater:
    """Applies updates to one model's params (an nnx.State the device step runs on), in place."""

    def __init__(self, params: nnx.State, spec: Any, model_config: Any, borrowed: set[int] | None = None):
        """`borrowed`: where the ids of the caller's own arrays placed without a copy are recorded (sleep must
        not delete those: the trainer still holds them)."""
        self.params, self.spec = params, spec
        self.borrowed = borrowed if borrowed is not None else set()
        self.dtype = model_config.dtype
        quantization = model_quantization(model_config)
        self.kept = dict(quantization.formats) if isinstance(quantization, KeptFormats) else {}
        self.scheme = None if self.kept else scheme_name(quantization)
        self.shapes = {path: _stacked_shape(_variable(params, path).get_value()) for path in _paths(params)}
        self.sources = {path: src for path, src in param_sources(spec).items() if path in self.shapes}
        self.feeds: dict[str, list[tuple[ParamPath, tuple[int, ...]]]] = {}  # HF name -> (param, stack position)
        for path, src in self.sources.items():
            for position, name in np.ndenumerate(src.names):
                self.feeds.setdefault(name, []).append((path, position))

    def update(self, checkpoint: Checkpoint) -> int:
        """Check the whole update, then read and swap each param it feeds; returns the params (leaves) swapped."""
        plan = self.plan(checkpoint)
        return sum(self._apply(checkpoint, update) for update in plan)

    def plan(self, checkpoint: Checkpoint) -> list[_ParamUpdate]:
        """The params the update feeds; a ValueError naming the first bad tensor, before anything changes."""
        names = checkpoint.names()
        unknown = sorted(n for n in names if n not in self.feeds and not ignored_tensor(n))
        if unknown:
            raise ValueError(f"update_weights: unknown tensor(s) for {self.spec.architecture}: "
                             f"{', '.join(unknown[:5])}")
        fed: dict[ParamPath, set[int]] = {}
        needed: dict[ParamPath, dict[str, tuple[int, ...]]] = {}
        for name in sorted(names & set(self.feeds)):
            for path, position in self.feeds[name]:
                if path not in needed:
                    needed[path] = self.sources[path].needed(self._float_shape(path))
                expected = needed[path][name]
                if checkpoint.shape(name) != expected:
                    raise ValueError(f"update_weights: {name!r} has shape {checkpoint.shape(name)}; the model's "
                                     f"is {expected}")
                fmt = self.kept.get(path[-1])
                if fmt and fmt not in QUANTIZABLE and not (
                        isinstance(checkpoint, GGUFCheckpoint) and stored_format(checkpoint.path, name) == fmt):
                    raise ValueError(f"update_weights: {name!r} feeds {'/'.join(path)}, kept in GGUF {fmt.upper()} "
                                     "blocks, which float tensors cannot be quantized to (gguf-py has no K-quant "
                                     "quantizer); pass a GGUF file storing it as " + fmt.upper())
                fed.setdefault(path, set()).add(position[0] if position else 0)
        plan = []
        for path, positions in fed.items():
            src = self.sources[path]
            dropped = isinstance(_variable(self.params, path).get_value(), jax.ShapeDtypeStruct)
            for p in sorted(positions):
                at = src.names[p] if src.stack_ndim else src.names
                missing = sorted(n for n in np.asarray(at).flat if n not in names)
                if missing and isinstance(src, FusedColumnsSource) and not dropped:
                    continue  # the parts left out keep their values (_apply_fused)
                if missing:
                    raise ValueError(f"update_weights: {'/'.join(path)} is read from {at.size} tensor(s) together; "
                                     f"the update lacks {', '.join(missing[:5])}")
            scale = self._scale(path)
            kept = self.kept.get(path[-1])
            if (scale and not kept and path != (EMBEDDING,) and len(self.shapes[scale]) == len(self.shapes[path])
                    and not isinstance(checkpoint, PrequantizedCheckpoint)):
                raise ValueError(f"update_weights: {'/'.join(path)} has grouped scales, which only a pre-quantized "
                                 "checkpoint (a path) carries; float tensors cannot be requantized to them yet")
            whole = not src.stack_ndim or len(positions) == src.names.shape[0]
            picked = None if whole else sorted(positions)
            if picked is not None and isinstance(_variable(self.params, path).get_value(), jax.ShapeDtypeStruct):
                raise ValueError(f"update_weights: {'/'.join(path)} was dropped by sleep(level=2); update all its "
                                 "layers at once, or wake_up(tags=['weights']) first")
            narrowed = src if picked is None else dataclasses.replace(src, names=src.names[picked])
            tensors = [checkpoint.arrays[n] for n in narrowed.names.flat if n in names] if isinstance(
                checkpoint, ArrayCheckpoint) else []
            from_device = (bool(tensors) and all(isinstance(t, jax.Array) for t in tensors)
                           and type(src) is ParamSource and self._scale(path) is None)
            plan.append(_ParamUpdate(path, narrowed, picked, from_device, kept))
        return plan

    def _float_shape(self, path: ParamPath) -> tuple[int, ...]:
        """The param's float shape: a kept GGUF param's values pack two 4-bit weights a byte along the grouped
        dim (model/grouped_quant.py)."""
        shape = self.shapes[path]
        fmt = self.kept.get(path[-1])
        if fmt is None or not packed(fmt):
            return shape
        axis = len(shape) - (1 if path == (EMBEDDING,) else 2)
        return shape[:axis] + (shape[axis] * 2,) + shape[axis + 1:]

    def _scale(self, path: ParamPath) -> ParamPath | None:
        scale = path[:-1] + (path[-1] + SCALE_SUFFIX,)
        return scale if scale in self.shapes else None

    def _apply(self, checkpoint: Checkpoint, update: _ParamUpdate) -> int:
        """Read the fed positions of one param (and its scale) as the loader would, then swap them in."""
        path, src = update.path, update.src
        if update.kept:
            return self._apply_kept(checkpoint, update)
        if isinstance(src, FusedColumnsSource):
            return self._apply_fused(checkpoint, update)
        count = src.names.shape[0] if src.stack_ndim else None
        paths = [path] + ([self._scale(path)] if self._scale(path) else [])
        if update.from_device:
            fresh = {path: self._on_device(checkpoint, src)}
        else:
            shapes = {p: _narrow(self.shapes[p], count) for p in paths}
            request = LoadRequest(self.spec, shapes, self.dtype, self._stacked_sharding, None, self.scheme)
            fresh = TensorLoader(checkpoint).read_params(request, {path: src})
        swapped = 0
        for p in paths:
            swapped += self._swap(p, fresh[p], update.positions)
        if update.from_device:  # what still shares the caller's buffers
            callers = set().union(*(_buffers(checkpoint.arrays[name]) for name in src.names.flat))
            value = _variable(self.params, path).get_value()
            self.borrowed.update(id(a) for a in (value if isinstance(value, tuple) else (value,))
                                 if _buffers(a) & callers)
        return swapped

    def _apply_fused(self, checkpoint: Checkpoint, update: _ParamUpdate) -> int:
        """A fused param's fed layers (model/fused_projections.py) rebuilt on its devices: each part the update names
        read as loading reads it (a jax.Array transposed and cast where it is), each part it leaves out taken from
        the param as it is, then joined in the layout."""
        path, src = update.path, update.src
        layout, value = src.layout, _variable(self.params, path).get_value()
        shape = _narrow(self.shapes[path], src.names.shape[0])
        names, dtype = checkpoint.names(), jnp.dtype(NP_DTYPES[self.dtype])
        positions = update.positions if update.positions is not None else range(src.names.shape[0])
        fresh = []
        for i, layer in enumerate(positions):
            sharding = _layer_sharding(value, layer)
            kept = None
            parts = []
            for p in range(len(layout.parts)):
                name = src.names[i, p]
                if name not in names:
                    kept = kept if kept is not None else layout.split(value[layer])
                    parts.append(kept[p])
                    continue
                part = src.part(p)
                array = checkpoint.arrays.get(name) if isinstance(checkpoint, ArrayCheckpoint) else None
                if isinstance(array, jax.Array) and type(part) is ParamSource:
                    array = (array.T if part.transpose else array).astype(dtype)
                else:
                    array = part.read(checkpoint, (slice(i, i + 1),), src.part_shape(shape, p),
                                      NP_DTYPES[self.dtype])[0]
                parts.append(jax.device_put(array, sharding))
            fresh.append(layout.join(parts))
        return self._swap(path, fresh, update.positions)

    def _apply_kept(self, checkpoint: Checkpoint, update: _ParamUpdate) -> int:
        """A GGUF-kept param's fed positions quantized to its format (or a GGUF path's own blocks), swapped in
        with their scales (and mins)."""
        path, src, fmt = update.path, update.src, update.kept
        transpose = path != (EMBEDDING,)  # linear weights (and the LM head) are [in, out]; the embedding [V, H]

        def parts_of(name: str) -> dict[str, np.ndarray]:
            stored = (stored_parts(checkpoint.path, name, fmt, transpose)
                      if isinstance(checkpoint, GGUFCheckpoint) else None)
            if stored is not None:
                return stored
            return quantized_parts(np.asarray(checkpoint.read(name, ()), np.float32), fmt, transpose)

        if src.stack_ndim:
            per_position = [parts_of(name) for name in src.names]
            fresh = {part: np.stack([p[part] for p in per_position]) for part in per_position[0]}
        else:
            fresh = parts_of(src.names[()])
        targets = {"values": path, "scale": path[:-1] + (path[-1] + SCALE_SUFFIX,),
                   "min": path[:-1] + (min_name(path[-1]),)}
        return sum(self._swap(targets[part], array, update.positions) for part, array in fresh.items())

    def _on_device(self, checkpoint: ArrayCheckpoint, src: ParamSource) -> list[jax.Array] | jax.Array:
        """A plain param's stack positions from jax.Arrays, on their devices: one array per position (a stack
        of experts for [layer, expert] sources), or the single array."""
        dtype = jnp.dtype(NP_DTYPES[self.dtype])

        def one(name: str) -> jax.Array:
            array = checkpoint.arrays[name]
            array = array.T if src.transpose else array
            return array if array.dtype == dtype else array.astype(dtype)

        if not src.stack_ndim:
            return one(src.names[()])
        return [one(names) if isinstance(names, str) else jnp.stack([one(n) for n in names.flat]).reshape(
            names.shape + one(names.flat[0]).shape) for names in src.names]

    def _stacked_sharding(self, path: ParamPath, shape: tuple[int, ...]) -> jax.sharding.Sharding:
        """Where the loader places a narrowed param: the stacked view of the sharding of what it replaces."""
        value = _variable(self.params, path).get_value()
        if not isinstance(value, tuple):
            return value.sharding
        sharding = value[0].sharding
        if isinstance(sharding, NamedSharding):
            return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))
        return sharding

    def _swap(self, path: ParamPath, fresh: jax.Array | list[jax.Array], positions: list[int] | None) -> int:
        """Replace the param's positions (all: None) with `fresh`, each on the sharding of the array it replaces."""
        variable = _variable(self.params, path)
        value = variable.get_value()
        if isinstance(value, tuple):  # per-layer arrays (the CPU's switched scan, --no-scan-layers)
            layers = list(value)
            picked = positions if positions is not None else range(len(layers))
            for i, p in enumerate(picked):
                layers[p] = _placed(fresh[i], layers[p].sharding)
            variable.set_value(tuple(layers))
            return len(picked)
        if isinstance(fresh, list):
            fresh = jnp.stack(fresh)
        if positions is None:
            variable.set_value(_placed(fresh, value.sharding))
        else:  # some layers of a stacked param: written into it on its devices
            variable.set_value(_write_rows(value, jnp.asarray(positions, jnp.int32), fresh))
        return 1


def _placed(array: jax.Array, sharding: jax.sharding.Sharding) -> jax.Array:
    """`array` on `sharding`: itself when it has that very sharding; else put there (no data copy when the
    shardings are equivalent). The compiled programs' cache keys on the sharding itself, so an equivalent one
    (a SingleDeviceSharding for a one-device mesh's) is re-wrapped, or the next step would trace again."""
    if isinstance(array, jax.Array) and array.sharding == sharding:
        return array
    return jax.device_put(array, sharding)


def _buffers(array: jax.Array) -> set[int]:
    return {shard.data.unsafe_buffer_pointer() for shard in array.addressable_shards}


def _layer_sharding(value: Any, layer: int) -> jax.sharding.Sharding:
    """The sharding of one layer of a param (per-layer arrays, or a stacked array without its layer axis)."""
    if isinstance(value, tuple):
        return value[layer].sharding
    sharding = value.sharding
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec(*tuple(sharding.spec)[1:]))
    return sharding


def _write_rows(stacked: jax.Array, positions: jax.Array, rows: jax.Array) -> jax.Array:
    write = jax.jit(lambda a, i, r: a.at[i].set(r.astype(a.dtype)), out_shardings=stacked.sharding,
                    donate_argnums=(0,))
    return write(stacked, positions, rows)


def _narrow(shape: tuple[int, ...], count: int | None) -> tuple[int, ...]:
    return shape if count is None else (count,) + tuple(shape[1:])


def _stacked_shape(value: Any) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)):
        return (len(value),) + tuple(value[0].shape)
    return tuple(value.shape)


def _paths(params: nnx.State) -> list[ParamPath]:
    def walk(node: Any, prefix: ParamPath) -> list[ParamPath]:
        if isinstance(node, dict):
            return [p for key, child in node.items() for p in walk(child, prefix + (key,))]
        return [prefix]

    return walk(nnx.to_pure_dict(params), ())


def param_variables(params: nnx.State) -> list[Any]:
    """Every param's variable (its value an array, or a tuple of per-layer arrays), for in-place swaps."""
    return [_variable(params, path) for path in _paths(params)]


def _variable(params: nnx.State, path: ParamPath) -> Any:
    node = params
    for key in path:
        node = node[key]
    return node

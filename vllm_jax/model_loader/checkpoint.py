"""Random access to a checkpoint's HF-named tensors, by slice.

Sharded loading asks each device's slice of each tensor; a safetensors file is memory-mapped and
`get_slice` reads only those bytes, so no device ever needs a full host copy of the model. GGUF tensors are
quantized blocks: each is dequantized once (float32) and sliced from there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import numpy as np

from vllm_jax.model_loader.source import ModelSource, ModelSourceError


class Checkpoint(Protocol):
    path: str

    def names(self) -> set[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray: ...

    def where(self, name: str) -> str: ...


def open_checkpoint(source: ModelSource) -> Checkpoint:
    if source.kind == "gguf":
        return GGUFCheckpoint(source.path)
    return SafetensorsCheckpoint(Path(source.path))


class GGUFCheckpoint:
    """All tensors dequantized up front: GGUF blocks cannot be sliced before dequantization."""

    def __init__(self, path: str):
        from vllm_jax.model_loader.gguf_file import iter_gguf_tensors

        self.path = path
        self._tensors = dict(iter_gguf_tensors(path))

    def names(self) -> set[str]:
        return set(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        return self._tensors[name][index]

    def where(self, name: str) -> str:
        return self.path


class SafetensorsCheckpoint:
    """Memory-mapped shards; a read touches only the requested slice."""

    def __init__(self, directory: Path):
        from safetensors import safe_open

        self.path = str(directory)
        self._handles = {}
        self._file_of: dict[str, str] = {}
        for file in safetensors_files(directory):
            try:
                handle = safe_open(str(file), framework="numpy")
                names = list(handle.keys())
            except Exception as exc:
                raise ModelSourceError(f"{file}: cannot read safetensors file ({exc})") from exc
            self._handles[str(file)] = handle
            for name in names:
                self._file_of[name] = str(file)

    def names(self) -> set[str]:
        return set(self._file_of)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._file_of[name]].get_slice(name).get_shape())

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        try:
            return np.asarray(self._handles[self._file_of[name]].get_slice(name)[index])
        except Exception as exc:
            raise ModelSourceError(f"{self.where(name)}: cannot read tensor {name!r} ({exc})") from exc

    def where(self, name: str) -> str:
        return self._file_of.get(name, self.path)


def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's shards: those named by model.safetensors.index.json, else every *.safetensors."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ModelSourceError(f"{index}: not a valid safetensors index ({exc})") from exc
        files = [directory / f for f in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise ModelSourceError(f"{index}: names shard {f.name}, which is missing")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelSourceError(f"{directory}: no *.safetensors files (only safetensors and GGUF weights are loaded; "
                               "pickled .bin checkpoints are refused because loading them can run code)")
    return files

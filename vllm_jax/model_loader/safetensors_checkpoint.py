"""An HF directory's safetensors shards as a `Checkpoint`: memory-mapped, a read touches only its slice.

safetensors' numpy reader cannot build float8 arrays (numpy has no such dtype), so a pre-quantized checkpoint's
F8_E4M3 tensors are memory-mapped here from the file's own header as ml_dtypes.float8_e4m3fn."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from vllm_jax.model_loader.errors import ModelSourceError


class SafetensorsCheckpoint:
    """Every shard opened once (`safe_open`, numpy); `get_slice` reads only the requested bytes."""

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

    def dtype(self, name: str) -> str:
        """The stored dtype as safetensors names it (F32, BF16, I8, F8_E4M3, ...)."""
        return self._handles[self._file_of[name]].get_slice(name).get_dtype()

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        try:
            if self.dtype(name) in _MAPPED_DTYPES:
                return np.asarray(self._mapped(name)[index])
            return np.asarray(self._handles[self._file_of[name]].get_slice(name)[index])
        except Exception as exc:
            raise ModelSourceError(f"{self.where(name)}: cannot read tensor {name!r} ({exc})") from exc

    def where(self, name: str) -> str:
        return self._file_of.get(name, self.path)

    def _mapped(self, name: str) -> np.ndarray:
        """The tensor as a read-only memory map (no bytes read until sliced)."""
        file = self._file_of[name]
        with open(file, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            entry = json.loads(f.read(header_len))[name]
        start, end = entry["data_offsets"]
        raw = np.memmap(file, dtype=np.uint8, mode="r", offset=8 + header_len + start, shape=(end - start,))
        return raw.view(_MAPPED_DTYPES[entry["dtype"]]).reshape(entry["shape"])


# dtypes safetensors' numpy reader refuses, read through a memory map instead
_MAPPED_DTYPES = {"F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn)}


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

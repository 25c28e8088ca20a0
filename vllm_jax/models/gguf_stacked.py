"""What llama.cpp's converter stacked or split, rebuilt into HF tensors: the shared part of the gpt-oss and
DeepSeek GGUF readers (models/gpt_oss/gguf.py, models/deepseek/gguf.py; docs/architecture/13-gguf.md, "GGUF files
of the MoE families"). One GGUF tensor may give several HF tensors and several GGUF tensors one: the parts are
buffered until a whole HF tensor can be built."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from vllm_jax.models.gguf_family import BLOCK_RE, GLOBAL_NAMES, GgufError, field


class StackedTensors:
    """GGUF tensors of one file -> HF tensors, fed in file order; `finish` says whether a part was left over. A
    family sets ONE_TO_ONE (GGUF block stem -> HF name under model.layers.{i}., "{kind}": weight / bias) and PARTS
    (stems combined with others into one HF tensor, built by `_combine`)."""

    ONE_TO_ONE: Mapping[str, str] = {}
    PARTS: tuple[str, ...] = ()

    def __init__(self, path: str, num_layers: int):
        self.path, self.num_layers = path, num_layers
        self._parts: dict[tuple[int, str], dict[str, np.ndarray]] = {}

    def claims(self, gguf_name: str) -> bool:
        """Whether this is a tensor of the family (else it has no HF counterpart: the caller's error)."""
        stem, _, kind = gguf_name.rpartition(".")
        if stem in GLOBAL_NAMES:
            return kind in ("weight", "bias")
        match = BLOCK_RE.fullmatch(gguf_name)
        return bool(match) and (match.group(2) in self.ONE_TO_ONE or match.group(2) in self.PARTS)

    def skipped(self, gguf_name: str) -> bool:
        """A multi-token-prediction layer's tensor (`blk.{n >= block_count}.*`, `*.nextn.*`): not read (nor
        dequantized), as the safetensors loader skips HF's model.layers.{num_hidden_layers}."""
        layer = re.match(r"blk\.(\d+)\.", gguf_name)
        return ".nextn." in gguf_name or bool(layer) and int(layer.group(1)) >= self.num_layers

    def convert(self, gguf_name: str, array: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """The HF tensors this GGUF tensor completes (none while its partners are still to come)."""
        stem, _, kind = gguf_name.rpartition(".")
        if stem in GLOBAL_NAMES:
            return [(f"{GLOBAL_NAMES[stem]}.{kind}", array)]
        match = BLOCK_RE.fullmatch(gguf_name)
        layer, stem, kind = int(match.group(1)), match.group(2), match.group(3)
        prefix = f"model.layers.{layer}."
        if stem in self.ONE_TO_ONE:
            name = self.ONE_TO_ONE[stem].format(kind=kind, bias="_bias" if kind == "bias" else "")
            return [(prefix + name, self._one_to_one(layer, stem, kind, array))]
        return self._combine(prefix, layer, stem, kind, array)

    def finish(self) -> None:
        if self._parts:
            (layer, group), parts = next(iter(self._parts.items()))
            raise GgufError(f"{self.path}: blk.{layer} has only {', '.join(sorted(parts))} of its {group} tensors")

    def _one_to_one(self, layer: int, stem: str, kind: str, array: np.ndarray) -> np.ndarray:
        """A 1:1 tensor's array in HF layout (as stored, unless the family says otherwise)."""
        return array

    def _combine(self, prefix: str, layer: int, stem: str, kind: str,
                 array: np.ndarray) -> list[tuple[str, np.ndarray]]:
        raise NotImplementedError

    def _collect(self, key: tuple[int, str], part: str, array: np.ndarray, needed: tuple[str, ...]):
        parts = self._parts.setdefault(key, {})
        parts[part] = array
        if set(parts) != set(needed):
            return None
        del self._parts[key]
        return [parts[p] for p in needed]


def required(reader: Any, arch: str, key: str) -> Any:
    """Metadata `{arch}.{key}`, which the family cannot do without."""
    value = field(reader, f"{arch}.{key}")
    if value is None:
        raise GgufError(f"{reader.data.filename}: GGUF metadata lacks {arch}.{key}, needed for the {arch} model")
    return value

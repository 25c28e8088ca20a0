"""The vocabulary a family uses to declare its GGUF support (docs/architecture/13-gguf.md): one `GgufArch` per
llama.cpp `general.architecture` it reads, llama's tensor names that the others override, and the metadata
helpers its hooks call. The GGUF reader (model_loader/gguf_file/) looks a file's architecture up in the registry
and follows its entry; it never names an architecture itself."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

# model-level tensors (".weight" / ".bias" appended by the caller)
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output": "lm_head",
    "output_norm": "model.norm",
}
# block tensors: GGUF stem -> HF name under model.layers.{i}., as llama.cpp's llama converter writes them
BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


class GgufError(ValueError):
    """A GGUF file that a family's hook cannot map back; the reader re-raises it as its ModelSourceError."""


class TensorConverter(Protocol):
    """A family's GGUF tensors -> HF tensors where llama.cpp stacked or split them (fed in file order)."""

    def claims(self, gguf_name: str) -> bool: ...

    def skipped(self, gguf_name: str) -> bool: ...

    def convert(self, gguf_name: str, array: np.ndarray) -> list[tuple[str, np.ndarray]]: ...

    def finish(self) -> None: ...


@dataclass(frozen=True)
class GgufArch:
    """One llama.cpp architecture a family reads: how its metadata and tensors map back to an HF checkpoint."""

    name: str  # llama.cpp's `general.architecture`
    config_class: str  # the transformers config class of the HF checkpoint
    hf_architecture: str  # its `architectures` entry
    permuted_qk: bool = False  # llama.cpp permuted the q/k rows for its rotary layout (llama-converted models)
    block_names: Mapping[str, str] = field(default_factory=dict)  # GGUF block stem -> HF name, over BLOCK_NAMES
    # (reader, generic kwargs) -> the family's own config fields; may rewrite the generic kwargs in place
    config: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None
    # reader -> (config class, HF architecture) when the file's metadata picks between variants (DeepSeek V2 / V3)
    config_class_of: Callable[[Any], tuple[str, str]] | None = None
    norm_shift: float = 0.0  # what llama.cpp added to the norm weights (1: Gemma 2 / 3)
    hf_name: Callable[[str], str | None] | None = None  # the family's own tensor names (None: block_names)
    tensors: Callable[[str, int], TensorConverter] | None = None  # (path, block count) -> stacked / split tensors
    llama3_rope_freqs: bool = True  # `rope_freqs.weight` holds llama3 rope scaling (Gemma 4: its rope mask)
    keeps_blocks: bool = True  # --quantization gguf can keep its quantized blocks on the device

    def tensor_name(self, gguf_name: str) -> str | None:
        """The HF tensor name of a GGUF tensor of this architecture; None when it has none."""
        if self.hf_name is not None:
            return self.hf_name(gguf_name)
        stem, _, kind = gguf_name.rpartition(".")
        if stem in GLOBAL_NAMES and kind in ("weight", "bias"):
            return f"{GLOBAL_NAMES[stem]}.{kind}"
        match = BLOCK_RE.fullmatch(gguf_name)
        if match and (hf := self.block_names.get(match.group(2)) or BLOCK_NAMES.get(match.group(2))):
            return f"model.layers.{match.group(1)}.{hf}.{match.group(3)}"
        return None


def field(reader: Any, key: str, default: Any = None) -> Any:
    """A metadata value (`default` when absent); a field that cannot be decoded is a GgufError."""
    entry = reader.fields.get(key)
    if entry is None:
        return default
    try:
        return entry.contents()
    except Exception as exc:
        raise GgufError(f"{reader.data.filename}: metadata {key} is corrupt ({exc})") from exc


def float32_decimal(value: float) -> float:
    """GGUF stores float32: 1e-5 comes back as 9.99999974e-06 unless read as the shortest float32 decimal."""
    return float(str(np.float32(value)))

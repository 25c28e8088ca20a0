"""Opening a GGUF file once for its config, tokenizer and tensors, and reading its metadata fields."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import numpy as np

from vllm_jax.model_loader.source import ModelSourceError

# general.architecture -> (config class name, HF architectures entry, q/k rows permuted by llama.cpp)
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", True),
    "mistral": ("MistralConfig", "MistralForCausalLM", True),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", False),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", False),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", False),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", False),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", False),  # text decoder only (gguf_file/gemma4.py)
    "phi3": ("Phi3Config", "Phi3ForCausalLM", False),
    "granite": ("GraniteConfig", "GraniteForCausalLM", True),  # llama.cpp converts it as a LlamaModel
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", False),
    "gpt-oss": ("GptOssConfig", "GptOssForCausalLM", False),
    "deepseek2": ("DeepseekV3Config", "DeepseekV3ForCausalLM", False),  # V2 by its gating (moe_families)
}


def open_gguf(path: str) -> Any:
    """The file's `gguf.GGUFReader`, shared by every reader of the same unchanged file."""
    path = os.path.realpath(os.path.expanduser(str(path)))
    if not os.path.isfile(path):
        raise ModelSourceError(f"{path}: no such GGUF file")
    stat = os.stat(path)
    return _open_reader(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _open_reader(path: str, _mtime_ns: int, _size: int) -> Any:
    """Parsing the metadata costs seconds on a real vocabulary; config, tokenizer and weights share one parse."""
    import gguf

    try:
        return gguf.GGUFReader(path)
    except Exception as exc:  # bad magic, truncated header or data, unknown value type, ...
        raise ModelSourceError(f"{path}: not a GGUF file, or a truncated or corrupt one "
                               f"({type(exc).__name__}: {exc})") from exc


def field(reader: Any, key: str, default: Any = None) -> Any:
    """A metadata value (`default` when absent); a field that cannot be decoded is a ModelSourceError."""
    entry = reader.fields.get(key)
    if entry is None:
        return default
    try:
        return entry.contents()
    except Exception as exc:
        raise ModelSourceError(f"{reader.data.filename}: metadata {key} is corrupt ({exc})") from exc


def architecture(reader: Any) -> str:
    """`general.architecture`, checked against the supported ones."""
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelSourceError(f"{reader.data.filename}: GGUF architecture {arch!r} is not supported "
                               f"(supported: {', '.join(ARCHITECTURES)})")
    return arch


def float32_decimal(value: float) -> float:
    """GGUF stores float32: 1e-5 comes back as 9.99999974e-06 unless read as the shortest float32 decimal."""
    return float(str(np.float32(value)))

"""A GGUF's tensors under HF names, in HF layout, dequantized to float32; and the file as a `Checkpoint`.

Supported storage types: those gguf-py dequantizes (_SUPPORTED_TYPES); casting to the model dtype is the loader's
job. llama.cpp permutes the q/k projection rows of llama-family models for its rotary layout and adds 1 to Gemma's
norm weights; both are undone here as the file's family entry says (models/gguf_family.py `GgufArch`), as are
gpt-oss's and DeepSeek's stacked / split expert and MLA tensors (their `tensors` converter), so the arrays equal
the HF weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.gguf_file.reader import architecture, open_gguf, source_errors
from vllm_jax.models.gguf_family import field

# llama.cpp's precomputed rope factors; the config folds them in
NOT_PARAMETERS = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
# every type gguf-py can dequantize (Q8_1, Q8_K and the integer types it cannot)
_SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                    "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
                    "TQ1_0", "TQ2_0", "MXFP4")


class GGUFCheckpoint:
    """All tensors dequantized up front: GGUF blocks cannot be sliced before dequantization."""

    def __init__(self, path: str, skip: frozenset[str] = frozenset()):
        """`skip`: HF names left out (tensors kept quantized, gguf_file/kept.py): neither read nor listed."""
        self.path = path
        self._tensors = dict(iter_gguf_tensors(path, skip))

    def names(self) -> set[str]:
        return set(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._tensors[name].shape)

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        return self._tensors[name][index]

    def where(self, name: str) -> str:
        return self.path


def iter_gguf_tensors(path: str, skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, np.ndarray]]:
    """(HF parameter name, float32 array in HF layout) for every tensor but `skip`'s, dequantized one at a time."""
    with source_errors():
        yield from _hf_tensors(path, skip)


def _hf_tensors(path: str, skip: frozenset[str]) -> Iterator[tuple[str, np.ndarray]]:
    import gguf

    reader = open_gguf(path)
    entry = architecture(reader)
    arch = entry.name
    heads = field(reader, f"{arch}.attention.head_count")
    kv_heads = field(reader, f"{arch}.attention.head_count_kv", heads)
    supported = {getattr(gguf.GGMLQuantizationType, t) for t in _SUPPORTED_TYPES}
    stacked = None  # a family whose tensors llama.cpp stacked or split (gpt-oss, DeepSeek)
    if entry.tensors is not None:
        stacked = entry.tensors(path, field(reader, f"{arch}.block_count") or 0)
    for tensor in reader.tensors:
        if tensor.name in NOT_PARAMETERS or (stacked is not None and stacked.skipped(tensor.name)):
            continue
        if stacked is None:
            name = entry.tensor_name(tensor.name)
        else:
            name = tensor.name if stacked.claims(tensor.name) else None
        if name is None:
            raise ModelSourceError(f"{path}: tensor {tensor.name} has no HF counterpart for architecture {arch}")
        if name in skip:
            continue
        if tensor.tensor_type not in supported:
            raise ModelSourceError(f"{path}: tensor {tensor.name} is stored as {tensor.tensor_type.name}, which "
                                   f"this engine cannot dequantize (supported: {', '.join(_SUPPORTED_TYPES)})")
        array = _dequantize(path, tensor)
        if stacked is not None:
            yield from stacked.convert(tensor.name, array)
            continue
        if entry.norm_shift and tensor.name.endswith("norm.weight"):
            array -= np.float32(entry.norm_shift)  # what llama.cpp added at conversion (Gemma's 1)
        if entry.permuted_qk and tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
            array = unpermute(array, heads)
        elif entry.permuted_qk and tensor.name.endswith(("attn_k.weight", "attn_k.bias")):
            array = unpermute(array, kv_heads)
        yield name, array
    if stacked is not None:
        stacked.finish()


def _dequantize(path: str, tensor: Any) -> np.ndarray:
    """One tensor as a writable float32 array in HF dimension order."""
    import gguf

    shape = tuple(int(n) for n in reversed(tensor.shape))  # ggml lists dimensions fastest first
    try:
        array = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
    except Exception as exc:
        raise ModelSourceError(f"{path}: tensor {tensor.name} ({tensor.tensor_type.name}, shape {shape}) is "
                               f"corrupt ({exc})") from exc
    # F32 comes back as a view of the read-only file mapping
    return array if array.flags.writeable else array.copy()


def unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `LlamaModel.permute`: per head, its rows went from (2, d/2) to (d/2, 2) order."""
    shape = rows.shape
    return rows.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)

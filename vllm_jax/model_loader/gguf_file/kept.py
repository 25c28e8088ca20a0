"""`--quantization gguf`: a GGUF's Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K weights placed as they are stored, re-laid out
for x @ W (model/grouped_quant.py) with no dequantization; every other tensor goes through the dequantizing loader.

Which params are kept (`kept_formats`) is decided per param of the model, before it is built: a layer weight is
kept when all its layers share one kept type (a stack holds one format); the embedding and an untied LM head
when their tensor has a kept type. A param in another type (F32 / F16 / BF16, or a stack mixing types) is
dequantized like today (Q5_K, Q3_K, IQ types, ...); a type the dequantizing loader cannot read is its error naming
the tensor.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from vllm_jax.model.grouped_quant import FORMATS, GROUP, min_name
from vllm_jax.model.quantization import KeptFormats, scale_name
from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.gguf_file.reader import architecture, open_gguf, reports_source_errors
from vllm_jax.model_loader.gguf_file.tensors import GGUFCheckpoint, unpermute
from vllm_jax.model_loader.tensor_loader import TensorLoader
from vllm_jax.model_loader.weight_loader import LoadRequest, ParamPath
from vllm_jax.models.gguf_family import field
from vllm_jax.models.llama.weights import LAYER_TENSORS

_KEPT_LAYER_WEIGHTS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_GLOBAL_TENSORS = {"embed_tokens": "model.embed_tokens.weight", "lm_head": "lm_head.weight"}
# (weights, bytes) of one block of each kept type
_BLOCKS = {"q8_0": (GROUP, 2 + GROUP), "q4_0": (GROUP, 2 + GROUP // 2), "q4_1": (GROUP, 4 + GROUP // 2),
           "q4_k": (256, 144), "q6_k": (256, 210)}


@reports_source_errors
def kept_formats(path: str) -> KeptFormats:
    """The params this file's quantized blocks can be kept for, and their formats."""
    reader = open_gguf(path)
    entry = architecture(reader)
    arch = entry.name
    if not entry.keeps_blocks:
        raise ModelSourceError(f"{path}: --quantization gguf (blocks kept on the device) is not supported for GGUF "
                               f"architecture {arch} (its model takes no quantized weights yet); drop "
                               "--quantization to load the file dequantized")
    types = {entry.tensor_name(t.name): t.tensor_type.name.lower() for t in reader.tensors}
    num_layers = field(reader, f"{arch}.block_count") or 0
    formats = []
    for name in _KEPT_LAYER_WEIGHTS:
        kinds = {types.get(_layer_tensor(name, i)) for i in range(num_layers)}
        if len(kinds) == 1 and (kind := kinds.pop()) in FORMATS:
            formats.append((name, kind))
    for name, hf_name in _GLOBAL_TENSORS.items():
        if types.get(hf_name) in FORMATS:
            formats.append((name, types[hf_name]))
    return KeptFormats(tuple(formats))


def _layer_tensor(name: str, layer: int) -> str:
    return f"model.layers.{layer}.{LAYER_TENSORS[name][0]}"


class KeptGGUFLoader:
    """Kept params from the file's blocks; the rest through `TensorLoader` over the dequantizing GGUFCheckpoint,
    which skips the kept tensors (never dequantized)."""

    def __init__(self, path: str, formats: KeptFormats):
        self.path, self.formats = path, dict(formats.formats)

    @reports_source_errors
    def load(self, request: LoadRequest) -> dict[ParamPath, jax.Array]:
        reader = open_gguf(self.path)
        entry = architecture(reader)
        tensors = {entry.tensor_name(t.name): t for t in reader.tensors}
        kept = {self._param_path(name): name for name in self.formats
                if self._param_path(name) in request.shapes}
        family = {p for path in kept for p in (path, _sibling(path, scale_name), _sibling(path, min_name))}
        skip = {hf for name in kept.values() for hf in self._hf_names(name, request.spec.num_layers)}
        rest = dataclasses.replace(request, quantization=None,
                                   shapes={p: s for p, s in request.shapes.items() if p not in family})
        arrays = TensorLoader(GGUFCheckpoint(self.path, skip=frozenset(skip))).load(rest)
        unpermute = _unpermute_heads(reader)
        for path, name in kept.items():
            hf_names = self._hf_names(name, request.spec.num_layers)
            parts = [_repack(self.path, tensors[hf], self.formats[name], unpermute.get(hf.split(".")[-2]),
                             transpose=name != "embed_tokens") for hf in hf_names]
            stacked = {part: np.stack([p[part] for p in parts]) if path[0] == "layers" else parts[0][part]
                       for part in parts[0]}
            targets = {"values": path, "scale": _sibling(path, scale_name), "min": _sibling(path, min_name)}
            for part, host in stacked.items():
                target = targets[part]
                if request.shapes.get(target) != host.shape:
                    raise ModelSourceError(f"{self.path}: tensor {hf_names[0]} gives {part} of shape {host.shape} "
                                           f"but the model expects {request.shapes.get(target)}")
                arrays[target] = jax.make_array_from_callback(
                    host.shape, request.sharding_for(target, host.shape), lambda index, host=host: host[index])
        return arrays

    @staticmethod
    def _param_path(name: str) -> ParamPath:
        return (name,) if name in _GLOBAL_TENSORS else ("layers", name)

    @staticmethod
    def _hf_names(name: str, num_layers: int) -> list[str]:
        if name in _GLOBAL_TENSORS:
            return [_GLOBAL_TENSORS[name]]
        return [_layer_tensor(name, i) for i in range(num_layers)]


@reports_source_errors
def stored_parts(path: str, hf_name: str, fmt: str, transpose: bool) -> dict[str, np.ndarray] | None:
    """The GGUF file's own blocks of tensor `hf_name` in our layout when it stores them in `fmt` (a weight
    update from a GGUF path then takes them as loading does, not requantized); None when it stores another type."""
    reader = open_gguf(path)
    tensor = _tensor(reader, hf_name)
    if tensor is None or tensor.tensor_type.name.lower() != fmt:
        return None
    return _repack(path, tensor, fmt, _unpermute_heads(reader).get(hf_name.split(".")[-2]), transpose)


@reports_source_errors
def stored_format(path: str, hf_name: str) -> str | None:
    """The lower-case GGML type the GGUF file stores tensor `hf_name` in (None: no such tensor)."""
    tensor = _tensor(open_gguf(path), hf_name)
    return None if tensor is None else tensor.tensor_type.name.lower()


def _tensor(reader: Any, hf_name: str) -> Any:
    entry = architecture(reader)
    return next((t for t in reader.tensors if entry.tensor_name(t.name) == hf_name), None)


def _sibling(path: ParamPath, rename) -> ParamPath:
    return path[:-1] + (rename(path[-1]),)


def _unpermute_heads(reader: Any) -> dict[str, int]:
    """HF projection name -> the head count llama.cpp permuted its rows by (llama-family q/k only)."""
    entry = architecture(reader)
    if not entry.permuted_qk:
        return {}
    arch = entry.name
    heads = field(reader, f"{arch}.attention.head_count")
    return {"q_proj": heads, "k_proj": field(reader, f"{arch}.attention.head_count_kv", heads)}


def _repack(path: str, tensor: Any, fmt: str, heads: int | None, transpose: bool) -> dict[str, np.ndarray]:
    """One GGUF tensor's blocks as {"values", "scale"[, "min"]}: HF rows [out, ...] (q/k rows un-permuted like
    the dequantizing loader), transposed to [in, out] for a linear weight."""
    if tensor.tensor_type.name.lower() != fmt:
        raise ModelSourceError(f"{path}: tensor {tensor.name} is {tensor.tensor_type.name}, expected {fmt.upper()}")
    cols = int(tensor.shape[0])  # ggml lists the fastest (input) dim first
    rows = int(np.prod([int(n) for n in tensor.shape[1:]]))
    raw = np.asarray(tensor.data).reshape(-1).view(np.uint8)
    block_weights, block_bytes = _BLOCKS[fmt]
    if cols % block_weights or raw.size != rows * cols // block_weights * block_bytes:
        raise ModelSourceError(f"{path}: tensor {tensor.name} ({fmt.upper()}, {rows} x {cols}) has {raw.size} bytes "
                               "of blocks, which do not match its shape")
    return block_parts(raw.reshape(rows, cols // block_weights, block_bytes), fmt, heads, transpose)


def block_parts(blocks: np.ndarray, fmt: str, heads: int | None, transpose: bool) -> dict[str, np.ndarray]:
    """Blocks [rows, n, bytes] of an HF [rows, cols] weight in `fmt` -> {"values", "scale"[, "min"]} in our layout
    (rows un-permuted by `heads` when llama.cpp permuted them; transposed to [in, out] for a linear weight).
    Weight updates quantize float tensors to blocks and come through here too (gguf_file/requantize.py)."""
    rows = blocks.shape[0]
    parts = _K_QUANTS[fmt](blocks) if fmt in _K_QUANTS else _simple_block_parts(blocks, fmt)
    parts = {k: v.reshape(rows, -1) for k, v in parts.items()}
    if heads:
        parts = {k: unpermute(v, heads) for k, v in parts.items()}
    return {k: np.ascontiguousarray(v.T) if transpose else v for k, v in parts.items()}


def _simple_block_parts(blocks: np.ndarray, fmt: str) -> dict[str, np.ndarray]:
    """Q8_0 / Q4_0 / Q4_1 blocks [rows, n, bytes]: float16 d (and m), then the quants, whose bytes are already our
    packing (grouped_quant.py)."""
    parts = {"scale": blocks[..., 0:2].copy().view(np.float16)[..., 0]}
    start = 2
    if fmt == "q4_1":
        parts["min"] = blocks[..., 2:4].copy().view(np.float16)[..., 0]
        start = 4
    qs = np.ascontiguousarray(blocks[..., start:])
    parts["values"] = qs.view(np.int8) if fmt == "q8_0" else qs
    return parts


def _q4_k_parts(blocks: np.ndarray) -> dict[str, np.ndarray]:
    """Q4_K super-blocks [rows, n, 144] (d, dmin float16; 12 bytes of 6-bit sub-block scales and mins; 128 bytes
    of quants, where byte i of 32-byte run j holds sub-block 2j's element i low and 2j + 1's high) -> per
    32-row sub-block float32 scale d * sc and min -(dmin * m), values repacked to our 4-bit order."""
    import gguf

    lead = blocks.shape[:-1]
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = gguf.quants.Q4_K.get_scale_min(np.ascontiguousarray(blocks[..., 4:16]).reshape(-1, 12))
    scale = d * sc.reshape(*lead, 8).astype(np.float32)
    minimum = -(dmin * m.reshape(*lead, 8).astype(np.float32))
    runs = blocks[..., 16:].reshape(*lead, 4, 1, 32)
    q = (runs >> np.array([0, 4], np.uint8).reshape(2, 1)) & 15  # [.., 4, 2, 32]: sub-blocks 2j, 2j + 1
    q = q.reshape(*lead, 8, 2, 16)  # each sub-block's first and second 16 elements
    packed = (q[..., 0, :] | (q[..., 1, :] << 4)).astype(np.uint8)  # byte b: element b low, 16 + b high
    return {"values": packed, "scale": scale, "min": minimum}


def _q6_k_parts(blocks: np.ndarray) -> dict[str, np.ndarray]:
    """Q6_K super-blocks [rows, n, 210] (128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 sub-block scales,
    float16 d) -> int8 values q - 32 in element order and per 16-row sub-block float32 scale d * sc."""
    lead = blocks.shape[:-1]
    low = blocks[..., :128].reshape(*lead, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(2, 1)
    high = blocks[..., 128:192].reshape(*lead, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    q = (low & 15).reshape(*lead, 256) | ((high & 3).reshape(*lead, 256) << 4)
    values = q.astype(np.int8) - np.int8(32)
    sc = blocks[..., 192:208].copy().view(np.int8).astype(np.float32)
    d = blocks[..., 208:210].copy().view(np.float16).astype(np.float32)
    return {"values": values, "scale": d * sc}


_K_QUANTS = {"q4_k": _q4_k_parts, "q6_k": _q6_k_parts}

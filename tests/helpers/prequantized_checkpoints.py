"""Tiny pre-quantized HF checkpoints, written as llm-compressor (compressed-tensors) and DeepSeek / Qwen3-FP8
(block fp8) write them, and the float checkpoint of exactly the weights they stand for (values x scales).

A tiny float Llama is saved by transformers, then its layers' linear weights are quantized here (numpy) and the
directory rewritten: `weight` in int8 / float8_e4m3fn, its `weight_scale` (compressed-tensors) or
`weight_scale_inv` (fp8 blocks), and config.json's `quantization_config` as those tools write it.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np

from tests.helpers.tiny_models import make_tiny_checkpoint

# 2 layers, width 64, FFN 256 (gate/up [256, 64], down [64, 256]: two 128-blocks on one axis), untied LM head
PREQUANT_MODEL = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=False)
LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj"
                    r"|block_sparse_moe\.experts\.\d+\.w[123])\.weight$")  # Mixtral's experts; its router stays
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)


def _ct_args(kind: str, strategy: str) -> dict:
    """A compressed-tensors QuantizationArgs dict, every key as compressed-tensors serializes it."""
    return {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None, "num_bits": 8,
            "observer": "minmax", "observer_kwargs": {}, "strategy": strategy, "symmetric": True, "type": kind}


def ct_config(kind: str, strategy: str, fmt: str, dynamic_activations: bool) -> dict:
    """compressed-tensors' quantization_config (llm-compressor's FP8_DYNAMIC / W8A8 / W8A16 presets' shape)."""
    acts = None
    if dynamic_activations:
        acts = {**_ct_args(kind, "token"), "dynamic": True, "observer": None}
    return {"config_groups": {"group_0": {"input_activations": acts, "output_activations": None,
                                          "targets": ["Linear"], "weights": _ct_args(kind, strategy)}},
            "format": fmt, "global_compression_ratio": None, "ignore": ["lm_head"], "kv_cache_scheme": None,
            "quant_method": "compressed-tensors", "quantization_status": "compressed", "sparsity_config": {}}


FP8_BLOCK_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                    "weight_block_size": [128, 128]}

# scheme -> (quantization_config, value dtype, scale layout, scale tensor suffix, scale dtype)
SCHEMES = {
    "ct_fp8_channel": (ct_config("float", "channel", "float-quantized", True), FP8, "channel", "weight_scale",
                       ml_dtypes.bfloat16),
    "ct_fp8_tensor": (ct_config("float", "tensor", "float-quantized", False), FP8, "tensor", "weight_scale",
                      ml_dtypes.bfloat16),
    "ct_int8_channel": (ct_config("int", "channel", "int-quantized", True), np.dtype(np.int8), "channel",
                        "weight_scale", np.float32),
    "fp8_block": (FP8_BLOCK_CONFIG, FP8, "block", "weight_scale_inv", np.float32),
}


def make_float_checkpoint(path: Path, arch: str = "llama") -> Path:
    make_tiny_checkpoint(arch, path, seed=5, **PREQUANT_MODEL)
    return path


def quantize_hf(w: np.ndarray, dtype: np.dtype, layout: str, scale_dtype) -> tuple[np.ndarray, np.ndarray]:
    """(values, stored scale) of an HF weight [out, in] as the checkpoint stores them."""
    qmax = 127.0 if dtype == np.int8 else 448.0
    if layout == "channel":
        scale = np.abs(w).max(axis=1, keepdims=True) / qmax
    elif layout == "tensor":
        scale = np.array([np.abs(w).max() / qmax])
    else:
        out, inp = w.shape
        scale = np.zeros((math.ceil(out / 128), math.ceil(inp / 128)))
        for i in range(scale.shape[0]):
            for j in range(scale.shape[1]):
                scale[i, j] = np.abs(w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]).max() / qmax
    scale = scale.astype(scale_dtype)
    scaled = np.clip(w / expand_scale(scale.astype(np.float32), w.shape, layout), -qmax, qmax)
    return (np.round(scaled) if dtype == np.int8 else scaled).astype(dtype), scale


def expand_scale(scale: np.ndarray, shape: tuple[int, int], layout: str) -> np.ndarray:
    if layout == "block":
        return np.repeat(np.repeat(scale, 128, 0), 128, 1)[:shape[0], :shape[1]]
    return np.broadcast_to(scale.reshape(-1, 1) if scale.size > 1 else scale.reshape(1, 1), shape)


def make_prequantized(float_dir: Path, out_dir: Path, scheme: str, name: str | None = None,
                      edit: Callable[[dict[str, np.ndarray]], None] | None = None) -> tuple[Path, Path]:
    """Write `out_dir`/`name` (the pre-quantized checkpoint; `name` defaults to the scheme) and
    `out_dir`/`name`_dequantized (float32, the weights it stands for) from the float checkpoint in `float_dir`;
    `edit` may alter the pre-quantized tensors before they are saved (bad-input tests).
    -> (pre-quantized, dequantized) dirs."""
    from safetensors.numpy import load_file, save_file

    config, dtype, layout, suffix, scale_dtype = SCHEMES[scheme]
    tensors = load_file(str(float_dir / "model.safetensors"))
    quantized, dequantized = {}, {}
    for tensor, w in tensors.items():
        if not LINEAR.match(tensor):
            quantized[tensor] = dequantized[tensor] = w
            continue
        values, scale = quantize_hf(w.astype(np.float32), dtype, layout, scale_dtype)
        quantized[tensor] = values
        quantized[tensor[:-len("weight")] + suffix] = scale
        dequantized[tensor] = values.astype(np.float32) * expand_scale(scale.astype(np.float32), w.shape, layout)
    if edit is not None:
        edit(quantized)
    name = name or scheme
    pq_dir, deq_dir = out_dir / name, out_dir / f"{name}_dequantized"
    for target, weights, quant in ((pq_dir, quantized, config), (deq_dir, dequantized, None)):
        shutil.copytree(float_dir, target, ignore=shutil.ignore_patterns("*.safetensors"))
        save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
        if quant is not None:
            set_quantization_config(target, quant)
    return pq_dir, deq_dir


def set_quantization_config(model_dir: Path, quant: dict | None) -> None:
    cfg_path = model_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["quantization_config"] = quant
    cfg_path.write_text(json.dumps(cfg, indent=2))

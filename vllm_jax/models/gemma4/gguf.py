"""GGUF files of Gemma 4 (llama.cpp's `gemma4` architecture, text decoder): tensor names and config, undone to
what an HF Gemma4ForCausalLM checkpoint holds (docs/architecture/13-gguf.md, "GGUF files of Gemma 4").

What llama.cpp's converter (`Gemma4Model`, a `Gemma3Model`) writes, and how it maps back:

- Norm weights are stored as they are: Gemma 4's RMSNorm scales by `weight`, so no 1 is added (GgufArch.norm_shift
  stays 0); `layer_scalar` becomes `blk.N.layer_output_scale.weight`; the per-layer-input (PLE) tensors take
  Gemma 3n's names (`per_layer_token_embd`, `per_layer_model_proj`, `per_layer_proj_norm`, `blk.N.inp_gate`,
  `blk.N.proj`, `blk.N.post_norm`).
- Per layer type head shapes: `attention.key_length` is the full layers' head_dim (HF `global_head_dim`),
  `key_length_swa` the sliding layers'; `head_count_kv` is one number, or per layer when the checkpoint has
  `num_global_key_value_heads`; `feed_forward_length` is per layer with `use_double_wide_mlp` (KV-shared layers
  twice as wide); `sliding_window_pattern` is one flag per layer (True: sliding); `shared_kv_layers` is
  `num_kv_shared_layers`.
- `attention_k_eq_v` is no key: full layers simply have no `attn_v` tensor, as in the HF checkpoint.
- The full layers' proportional rope is a `rope_freqs.weight` of 1 for the rotated frequencies and 1e30 (frequency
  0) for the rest; its count of ones gives `partial_rotary_factor`. `rope.freq_base` / `freq_base_swa` are the
  full / sliding bases.

The MoE block (gemma-4-26B-A4B: router, stacked experts, extra norms, expert_* keys) maps back in gguf_moe.py.

Refused with a GgufError naming the cause, as they cannot be mapped back exactly or are not built: vision /
audio tensors (llama.cpp writes those to a separate mmproj file; this engine serves the text decoder), rope
scaling, sliding rope over part of the head, and head shapes or MLP widths that disagree with the tensors.
`attention.scale` / `attn_logit_softcapping` are ignored, as llama.cpp's gemma4 loader does (softmax scale 1, no
attention cap).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from vllm_jax.models.gemma.gguf import GEMMA_BLOCK_NAMES
from vllm_jax.models.gemma4.gguf_moe import MOE_STEMS, moe_config, moe_hf_name
from vllm_jax.models.gguf_family import BLOCK_NAMES, GLOBAL_NAMES, GgufArch, GgufError, field, float32_decimal

ARCH = "gemma4"
# Gemma 3n's per-layer-input (PLE) names beside llama's
_GLOBAL = GLOBAL_NAMES | {
    "per_layer_token_embd": "model.embed_tokens_per_layer",
    "per_layer_model_proj": "model.per_layer_model_projection",
    "per_layer_proj_norm": "model.per_layer_projection_norm",
}
_BLOCK = BLOCK_NAMES | GEMMA_BLOCK_NAMES | {
    "inp_gate": "per_layer_input_gate",
    "proj": "per_layer_projection",
    "post_norm": "post_per_layer_input_norm",
}
_MULTIMODAL = ("v.", "a.", "mm.", "conformer.", "vision", "audio")
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(\w+)")
_UNROTATED = 1e20  # llama.cpp writes 1e30 as the frequency divisor of the dims proportional rope leaves unrotated


def gemma4_hf_name(gguf_name: str) -> str | None:
    """The HF name of a `gemma4` GGUF tensor; None when it has none; vision / audio tensors refused (the MoE
    block's names: gguf_moe.py)."""
    if gguf_name.startswith(_MULTIMODAL):
        raise GgufError(f"GGUF tensor {gguf_name} belongs to Gemma 4's vision / audio encoder; this engine "
                               "serves the text decoder only (use the text GGUF; llama.cpp writes the encoders to a "
                               "separate mmproj file)")
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _GLOBAL and kind == "weight":
        return f"{_GLOBAL[stem]}.weight"
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match is None:
        return None
    layer, name, kind = match.groups()
    if name in MOE_STEMS:
        return moe_hf_name(gguf_name, layer, name, kind)
    if name == "layer_output_scale" and kind == "weight":
        return f"model.layers.{layer}.layer_scalar"  # an HF buffer, named without .weight
    if name in _BLOCK and kind == "weight":
        return f"model.layers.{layer}.{_BLOCK[name]}.weight"
    return None


def gemma4_config(reader: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The Gemma4TextConfig fields of a `gemma4` file; rewrites the generic `kwargs` (config.py) where Gemma 4's
    keys mean something else (head_dim, per-layer KV heads and MLP widths, rope) in place."""
    path = reader.data.filename
    n = kwargs["num_hidden_layers"]
    shapes = _tensor_shapes(reader)
    # attention.scale and attn_logit_softcapping are not read: llama.cpp fixes Gemma 4's softmax scale at 1 and
    # has no attention cap for it, as transformers
    sliding = _sliding_flags(reader, n, path)
    types = ["sliding_attention" if s else "full_attention" for s in sliding]
    head_dim, global_head_dim = _head_dims(reader, path)
    kv_heads = _per_layer(kwargs["num_key_value_heads"], n, "attention.head_count_kv", path)
    shared = int(field(reader, f"{ARCH}.attention.shared_kv_layers", 0) or 0)
    first_shared = n - shared
    sliding_kv = _one_value([kv_heads[i] for i in range(n) if sliding[i]], "sliding", path)
    full_kv = _one_value([kv_heads[i] for i in range(n) if not sliding[i]], "full", path)
    for i in range(first_shared):
        _check_rows(shapes, i, "attn_k", kv_heads[i] * (head_dim if sliding[i] else global_head_dim), path)
    intermediate, double_wide = _mlp_widths(kwargs["intermediate_size"], n, first_shared, path)
    kwargs.update(head_dim=head_dim, intermediate_size=intermediate,
                  num_key_value_heads=sliding_kv if sliding_kv is not None else full_kv)
    full_layer = {"head_dim": global_head_dim}
    if full_kv is not None and full_kv != kwargs["num_key_value_heads"]:
        full_layer["num_key_value_heads"] = full_kv
    kwargs["rope_parameters"] = _rope(reader, kwargs, head_dim, global_head_dim, path)
    ple = int(field(reader, f"{ARCH}.embedding_length_per_layer_input", 0) or 0)
    ple_rows = shapes.get("per_layer_token_embd.weight", (0, kwargs["vocab_size"]))[-1]
    out: dict[str, Any] = {
        "layer_types": types, "per_layer_config": {i: dict(full_layer) for i in range(n) if not sliding[i]},
        "num_kv_shared_layers": shared, "use_double_wide_mlp": double_wide,
        "attention_k_eq_v": _k_eq_v(shapes, sliding, first_shared, path),
        "hidden_size_per_layer_input": ple, "vocab_size_per_layer_input": int(ple_rows),
        "hidden_activation": "gelu_pytorch_tanh",
        **moe_config(reader, shapes, n, kwargs["hidden_size"], path),
    }
    final_cap = field(reader, f"{ARCH}.final_logit_softcapping")
    out["final_logit_softcapping"] = float32_decimal(final_cap) if final_cap else None
    if kwargs.get("sliding_window") is None:
        if any(sliding):
            raise GgufError(f"{path}: GGUF metadata lacks {ARCH}.attention.sliding_window, needed for the "
                                   "sliding layers")
        kwargs["sliding_window"] = 512  # unused without sliding layers; transformers' default
    return out


def _tensor_shapes(reader: Any) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape in ggml order (fastest dim first: [in, out] for a linear weight)."""
    return {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}


def _sliding_flags(reader: Any, n: int, path: str) -> list[bool]:
    """`attention.sliding_window_pattern`: one flag per layer, True for sliding (what the converter writes), or
    one flag for every layer (llama.cpp reads it as key or array)."""
    pattern = field(reader, f"{ARCH}.attention.sliding_window_pattern")
    if isinstance(pattern, (bool, int)):
        pattern = [bool(pattern)] * n
    if not isinstance(pattern, list) or len(pattern) != n:
        raise GgufError(f"{path}: {ARCH}.attention.sliding_window_pattern must hold one flag per layer "
                               f"({n}); got {pattern!r}")
    if pattern[-1]:
        raise GgufError(f"{path}: the last layer of a Gemma 4 must be a full-attention layer "
                               "(transformers forces it); this file makes it sliding")
    return [bool(flag) for flag in pattern]


def _head_dims(reader: Any, path: str) -> tuple[int, int]:
    """(sliding head_dim, full head_dim): key_length_swa and key_length; values must have the same widths."""
    global_dim = field(reader, f"{ARCH}.attention.key_length")
    if global_dim is None:
        raise GgufError(f"{path}: GGUF metadata lacks {ARCH}.attention.key_length (the full layers' head_dim)")
    local_dim = field(reader, f"{ARCH}.attention.key_length_swa", global_dim)
    for key, want in (("value_length", global_dim), ("value_length_swa", local_dim)):
        if field(reader, f"{ARCH}.attention.{key}", want) != want:
            raise GgufError(f"{path}: {ARCH}.attention.{key} differs from the key width {want}; Gemma 4's "
                                   "K and V heads have one width")
    return int(local_dim), int(global_dim)


def _per_layer(value: Any, n: int, key: str, path: str) -> list[int]:
    """A key written as one number or one per layer, as a per-layer list."""
    values = list(value) if isinstance(value, list) else [value] * n
    if len(values) != n:
        raise GgufError(f"{path}: {ARCH}.{key} has {len(values)} entries for {n} layers")
    return [int(v) for v in values]


def _one_value(values: list[int], kind: str, path: str) -> int | None:
    if len(set(values)) > 1:
        raise GgufError(f"{path}: {ARCH}.attention.head_count_kv differs between {kind} layers {values}; "
                               "Gemma 4 has one count per layer type")
    return values[0] if values else None


def _check_rows(shapes: dict[str, tuple[int, ...]], layer: int, name: str, rows: int, path: str) -> None:
    shape = shapes.get(f"blk.{layer}.{name}.weight")
    if shape is not None and shape[-1] != rows:
        raise GgufError(f"{path}: blk.{layer}.{name}.weight has {shape[-1]} rows, but the metadata's heads "
                               f"and head width give {rows}")


def _mlp_widths(value: Any, n: int, first_shared: int, path: str) -> tuple[int, bool]:
    """(intermediate_size, use_double_wide_mlp) from `feed_forward_length`: KV-shared layers either as wide as
    the others or twice as wide."""
    widths = _per_layer(value, n, "feed_forward_length", path)
    base = widths[0]
    own, shared = set(widths[:first_shared]), set(widths[first_shared:])
    if own != {base} or not shared <= {base} and shared != {2 * base}:
        raise GgufError(f"{path}: {ARCH}.feed_forward_length {widths} is not one width, with the KV-shared "
                               "layers' optionally doubled (use_double_wide_mlp)")
    return base, shared == {2 * base}


def _k_eq_v(shapes: dict[str, tuple[int, ...]], sliding: list[bool], first_shared: int, path: str) -> bool:
    """attention_k_eq_v: the full layers that compute K/V have attn_k but no attn_v."""
    full = [i for i in range(first_shared) if not sliding[i]]
    missing = [i for i in full if f"blk.{i}.attn_v.weight" not in shapes]
    if missing and missing != full:
        raise GgufError(f"{path}: full-attention layers {missing} have no attn_v but others do; "
                               "attention_k_eq_v holds for all full layers or none")
    if any(f"blk.{i}.attn_v.weight" not in shapes for i in range(first_shared) if sliding[i]):
        raise GgufError(f"{path}: a sliding layer has no attn_v.weight")
    return bool(full) and bool(missing)


def _rope(reader: Any, kwargs: dict[str, Any], head_dim: int, global_head_dim: int, path: str) -> dict[str, Any]:
    """Per layer type rope: sliding default rope at `freq_base_swa`, full proportional rope at `freq_base` with
    `partial_rotary_factor` from `rope_freqs.weight`."""
    generic = kwargs["rope_parameters"]
    if generic.get("rope_type") != "default":
        raise GgufError(f"{path}: rope scaling ({generic.get('rope_type')}) is not part of Gemma 4")
    for key, width in (("rope.dimension_count", global_head_dim), ("rope.dimension_count_swa", head_dim)):
        if field(reader, f"{ARCH}.{key}", width) != width:
            raise GgufError(f"{path}: {ARCH}.{key} is {field(reader, f'{ARCH}.{key}')}, not the head width "
                                   f"{width}; only the full layers' proportional rope leaves dims unrotated, and "
                                   "through rope_freqs.weight")
    full = {"rope_type": "proportional", "rope_theta": generic["rope_theta"],
            "partial_rotary_factor": _partial_rotary_factor(reader, global_head_dim, path)}
    local_theta = field(reader, f"{ARCH}.rope.freq_base_swa")  # absent: llama.cpp uses the full layers' base
    local = {"rope_type": "default",
             "rope_theta": float32_decimal(local_theta) if local_theta is not None else generic["rope_theta"]}
    return {"full_attention": full, "sliding_attention": local}


def _partial_rotary_factor(reader: Any, global_head_dim: int, path: str) -> float:
    """`rope_freqs.weight` is [1] * rotated + [1e30] * unrotated over global_head_dim / 2 frequencies."""
    tensor = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if tensor is None:
        return 1.0
    import gguf

    divisors = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float64).reshape(-1)
    rotated = int(np.sum(divisors == 1.0))
    if divisors.size != global_head_dim // 2 or not (np.all(divisors[:rotated] == 1.0)
                                                    and np.all(divisors[rotated:] > _UNROTATED)):
        raise GgufError(f"{path}: rope_freqs.weight is not the proportional-rope mask llama.cpp writes for "
                               f"Gemma 4 (ones, then 1e30, over {global_head_dim // 2} frequencies)")
    return 2 * rotated / global_head_dim


GGUF_ARCHS = (GgufArch(ARCH, "Gemma4TextConfig", "Gemma4ForCausalLM", config=gemma4_config, hf_name=gemma4_hf_name,
                       llama3_rope_freqs=False),)

"""What llama.cpp's converter does differently for Gemma 2 / Gemma 3 / Phi-3 / Granite / OLMo 2, undone here
(docs/architecture/13-gguf.md, "GGUF files of the newer families").

- Tensor names: GGUF reuses `ffn_norm`, `post_attention_norm` and `ffn_up` with per-architecture meanings
  (Gemma's `ffn_norm` is the pre-feedforward norm, Phi-3's `attn_qkv` / `ffn_up` hold the fused projections):
  names.BLOCK_OVERRIDES.
- Gemma's RMSNorm weights are stored with 1 added (llama.cpp multiplies by the weight, Gemma by 1 + weight).
- Config keys that exist only for one family: Granite's four multipliers, Gemma's soft caps and query scale,
  Gemma 3's sliding pattern and local rope base, Phi-3's long-rope factor tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_jax.model_loader.gguf_file.gemma4 import gemma4_config
from vllm_jax.model_loader.gguf_file.reader import field, float32_decimal
from vllm_jax.model_loader.source import ModelSourceError

# llama.cpp's precomputed rope factors; the config folds them in
NOT_PARAMETERS = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
_GEMMA = ("gemma2", "gemma3")
# llama.cpp's own rule for the Gemma 27B models, whose query_pre_attn_scalar is hidden / heads, not head_dim
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def norm_shift(arch: str, gguf_name: str) -> float:
    """What llama.cpp added to this tensor at conversion (1 on Gemma's norm weights)."""
    return 1.0 if arch in _GEMMA and gguf_name.endswith("norm.weight") else 0.0


def family_config(reader: Any, arch: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The HF config fields only this family has, from its keys (and, for Phi-3, its rope factor tensors);
    may rewrite the generic `kwargs` (rope parameters, head_dim) in place."""
    if arch in _GEMMA:
        return _gemma(reader, arch, kwargs)
    if arch == "gemma4":
        return gemma4_config(reader, kwargs)
    if arch == "phi3":
        return _phi3(reader, kwargs)
    if arch == "granite":
        keys = {"attention_multiplier": "attention.scale", "embedding_multiplier": "embedding_scale",
                "residual_multiplier": "residual_scale", "logits_scaling": "logit_scale"}
        return {hf: float32_decimal(value) for hf, key in keys.items()
                if (value := field(reader, f"granite.{key}")) is not None}
    return {}


def _gemma(reader: Any, arch: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    layers, head_dim = kwargs["num_hidden_layers"], kwargs["head_dim"]
    scale = field(reader, f"{arch}.attention.scale")
    if scale:
        scalar = float32_decimal(float(scale) ** -2)
    elif layers == _GEMMA_27B_LAYERS[arch]:
        scalar = kwargs["hidden_size"] // kwargs["num_attention_heads"]
    else:
        scalar = head_dim
    out: dict[str, Any] = {"query_pre_attn_scalar": scalar, "hidden_activation": "gelu_pytorch_tanh"}
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = field(reader, f"{arch}.{key}")
        out[key] = float32_decimal(value) if value else None
    if arch == "gemma2":
        return out
    out["attn_logit_softcapping"] = None  # Gemma 3 has none (transformers ignores it anyway)
    out["layer_types"] = _gemma3_layer_types(reader, layers)
    local_theta = field(reader, "gemma3.rope.freq_base_swa", 10000.0)  # llama.cpp's fixed local base
    kwargs["rope_parameters"] = {"full_attention": kwargs["rope_parameters"],
                                 "sliding_attention": {"rope_type": "default",
                                                       "rope_theta": float32_decimal(local_theta)}}
    return out


def _gemma3_layer_types(reader: Any, layers: int) -> list[str]:
    """`attention.sliding_window_pattern`: a period n (every n-th layer global) or one flag per layer (True:
    sliding); absent: llama.cpp's fixed period 6."""
    pattern = field(reader, "gemma3.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ModelSourceError(f"{reader.data.filename}: gemma3.attention.sliding_window_pattern has "
                                   f"{len(pattern)} entries for {layers} layers")
        return ["sliding_attention" if flag else "full_attention" for flag in pattern]
    return ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention" for i in range(layers)]


def _phi3(reader: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Phi-3 has no head_dim key (hidden / heads); `rope.dimension_count` smaller than that is partial rotary;
    window 0 means none; long-rope factors are tensors."""
    head_dim = kwargs["hidden_size"] // kwargs["num_attention_heads"]
    rope_dims = field(reader, "phi3.rope.dimension_count") or head_dim
    kwargs["head_dim"] = head_dim
    rope = kwargs["rope_parameters"]
    if rope_dims != head_dim:
        rope["partial_rotary_factor"] = rope_dims / head_dim
    out: dict[str, Any] = {"sliding_window": field(reader, "phi3.attention.sliding_window") or None}
    original = field(reader, "phi3.rope.scaling.original_context_length")
    if original:
        out["original_max_position_embeddings"] = int(original)
    factors = {t.name: t for t in reader.tensors if t.name in ("rope_factors_long.weight", "rope_factors_short.weight")}
    if factors:
        if len(factors) != 2 or not original:
            raise ModelSourceError(f"{reader.data.filename}: Phi-3 long rope needs rope_factors_long, "
                                   "rope_factors_short and phi3.rope.scaling.original_context_length")
        rope["rope_type"] = "longrope"
        rope["original_max_position_embeddings"] = int(original)
        for kind in ("long", "short"):
            values = np.asarray(factors[f"rope_factors_{kind}.weight"].data, np.float32).reshape(-1)
            rope[f"{kind}_factor"] = [float32_decimal(v) for v in values]
    return out

"""GGUF files of Phi-3 (llama.cpp's `phi3`; docs/architecture/13-gguf.md, "GGUF files of the newer families"): its
`attn_qkv` / `ffn_up` hold the fused projections, it has no head_dim key, and its long-rope factors are tensors."""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_jax.models.gguf_family import GgufArch, GgufError, field, float32_decimal


def phi3_config(reader: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
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
            raise GgufError(f"{reader.data.filename}: Phi-3 long rope needs rope_factors_long, "
                                   "rope_factors_short and phi3.rope.scaling.original_context_length")
        rope["rope_type"] = "longrope"
        rope["original_max_position_embeddings"] = int(original)
        for kind in ("long", "short"):
            values = np.asarray(factors[f"rope_factors_{kind}.weight"].data, np.float32).reshape(-1)
            rope[f"{kind}_factor"] = [float32_decimal(v) for v in values]
    return out


GGUF_ARCHS = (GgufArch("phi3", "Phi3Config", "Phi3ForCausalLM",
                       block_names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
                       config=phi3_config),)

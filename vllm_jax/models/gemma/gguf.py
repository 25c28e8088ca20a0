"""GGUF files of Gemma 2 / Gemma 3 (llama.cpp's `gemma2`, `gemma3`): what its converter does differently, undone
(docs/architecture/13-gguf.md, "GGUF files of the newer families").

- Tensor names: GGUF reuses `ffn_norm` and `post_attention_norm` with other meanings (Gemma's `ffn_norm` is the
  pre-feedforward norm).
- Gemma's RMSNorm weights are stored with 1 added (llama.cpp multiplies by the weight, Gemma by 1 + weight).
- Config keys only Gemma has: its soft caps and query scale, Gemma 3's sliding pattern and local rope base.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from vllm_jax.models.gguf_family import GgufArch, GgufError, field, float32_decimal

# the block names Gemma's converter gives another meaning than llama's (Gemma 4 reuses them)
GEMMA_BLOCK_NAMES = {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                     "post_ffw_norm": "post_feedforward_layernorm"}
# llama.cpp's own rule for the Gemma 27B models, whose query_pre_attn_scalar is hidden / heads, not head_dim
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def gemma_config(arch: str, reader: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
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
            raise GgufError(f"{reader.data.filename}: gemma3.attention.sliding_window_pattern has "
                                   f"{len(pattern)} entries for {layers} layers")
        return ["sliding_attention" if flag else "full_attention" for flag in pattern]
    return ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention" for i in range(layers)]


GGUF_ARCHS = tuple(GgufArch(arch, config_class, hf_arch, block_names=GEMMA_BLOCK_NAMES,
                            config=partial(gemma_config, arch), norm_shift=1.0)
                   for arch, config_class, hf_arch in (("gemma2", "Gemma2Config", "Gemma2ForCausalLM"),
                                                       ("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM")))

"""The dense decoder's params by HF tensor name (the per-parameter mapping the loader follows)."""

from __future__ import annotations

from vllm_jax.model.spec import DecoderSpec
from vllm_jax.models.param_source import ParamSource, per_layer, single

# our stacked layer param -> (HF suffix under model.layers.{layer}., transpose)
LAYER_TENSORS: dict[str, tuple[str, bool]] = {
    "input_norm": ("input_layernorm.weight", False),
    "post_attention_norm": ("post_attention_layernorm.weight", False),
    "q_proj": ("self_attn.q_proj.weight", True),
    "k_proj": ("self_attn.k_proj.weight", True),
    "v_proj": ("self_attn.v_proj.weight", True),
    "o_proj": ("self_attn.o_proj.weight", True),
    "q_bias": ("self_attn.q_proj.bias", False),
    "k_bias": ("self_attn.k_proj.bias", False),
    "v_bias": ("self_attn.v_proj.bias", False),
    "o_bias": ("self_attn.o_proj.bias", False),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
    "gate_proj": ("mlp.gate_proj.weight", True),
    "up_proj": ("mlp.up_proj.weight", True),
    "down_proj": ("mlp.down_proj.weight", True),
    "gate_bias": ("mlp.gate_proj.bias", False),
    "up_bias": ("mlp.up_proj.bias", False),
    "down_bias": ("mlp.down_proj.bias", False),
}


def decoder_param_sources(spec: DecoderSpec) -> dict[tuple[str, ...], ParamSource]:
    """Every param the decoder may have; the loader uses the entries its param tree actually contains."""
    sources = {
        ("embed_tokens",): single("model.embed_tokens.weight"),
        ("final_norm",): single("model.norm.weight"),
        ("lm_head",): single("lm_head.weight", transpose=True),
    }
    for name, (suffix, transpose) in LAYER_TENSORS.items():
        sources[("layers", name)] = per_layer(f"model.layers.{{layer}}.{suffix}", spec.num_layers, transpose)
    return sources

"""Qwen3.5's params by HF tensor name: per-layer norms and MLP over every layer, attention params over the attention
layers, DeltaNet params over the DeltaNet layers (each stacked in layer order)."""

from __future__ import annotations

from vllm_jax.models.param_source import ParamSource, per_layer, single
from vllm_jax.models.qwen3_5.spec import Qwen3_5Spec

EVERY_LAYER = {  # our param -> (HF suffix under model.layers.{layer}., transpose)
    "input_norm": ("input_layernorm.weight", False),
    "post_attention_norm": ("post_attention_layernorm.weight", False),
    "gate_proj": ("mlp.gate_proj.weight", True),
    "up_proj": ("mlp.up_proj.weight", True),
    "down_proj": ("mlp.down_proj.weight", True),
}
ATTENTION_LAYERS = {
    "q_proj": ("self_attn.q_proj.weight", True),  # [hidden, heads * 2 * head_dim]: each head's query, then its gate
    "k_proj": ("self_attn.k_proj.weight", True),
    "v_proj": ("self_attn.v_proj.weight", True),
    "o_proj": ("self_attn.o_proj.weight", True),
    "q_bias": ("self_attn.q_proj.bias", False),
    "k_bias": ("self_attn.k_proj.bias", False),
    "v_bias": ("self_attn.v_proj.bias", False),
    "o_bias": ("self_attn.o_proj.bias", False),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
}
DELTANET_LAYERS = {
    "in_proj_qkv": ("linear_attn.in_proj_qkv.weight", True),
    "in_proj_z": ("linear_attn.in_proj_z.weight", True),
    "in_proj_b": ("linear_attn.in_proj_b.weight", True),
    "in_proj_a": ("linear_attn.in_proj_a.weight", True),
    "conv1d": ("linear_attn.conv1d.weight", False),  # [channels, 1, kernel], as stored
    "dt_bias": ("linear_attn.dt_bias", False),
    "A_log": ("linear_attn.A_log", False),
    "gated_norm": ("linear_attn.norm.weight", False),
    "out_proj": ("linear_attn.out_proj.weight", True),
}


def qwen3_5_param_sources(spec: Qwen3_5Spec) -> dict[tuple[str, ...], ParamSource]:
    sources = {
        ("embed_tokens",): single("model.embed_tokens.weight"),
        ("final_norm",): single("model.norm.weight"),
        ("lm_head",): single("lm_head.weight", transpose=True),
    }
    for table, layers in ((EVERY_LAYER, spec.num_layers), (ATTENTION_LAYERS, spec.attention_layers),
                          (DELTANET_LAYERS, spec.recurrent_layers)):
        for name, (suffix, transpose) in table.items():
            sources[("layers", name)] = per_layer(f"model.layers.{{layer}}.{suffix}", layers, transpose)
    return sources

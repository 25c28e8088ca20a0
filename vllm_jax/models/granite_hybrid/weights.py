"""Granite 4.0-H's params by HF tensor name: norms and the shared MLP over every layer (its fused input_linear read
as the gate rows, then the up rows), attention params over the attention layers, Mamba2 params over the Mamba
layers."""

from __future__ import annotations

from vllm_jax.models.fused_weights import fused_part
from vllm_jax.models.granite_hybrid.spec import GraniteHybridSpec
from vllm_jax.models.param_source import ParamSource, per_layer, single

EVERY_LAYER = {
    "input_norm": ("input_layernorm.weight", False),
    "post_attention_norm": ("post_attention_layernorm.weight", False),
    "down_proj": ("shared_mlp.output_linear.weight", True),
}
ATTENTION_LAYERS = {
    "q_proj": ("self_attn.q_proj.weight", True),
    "k_proj": ("self_attn.k_proj.weight", True),
    "v_proj": ("self_attn.v_proj.weight", True),
    "o_proj": ("self_attn.o_proj.weight", True),
    "q_bias": ("self_attn.q_proj.bias", False),
    "k_bias": ("self_attn.k_proj.bias", False),
    "v_bias": ("self_attn.v_proj.bias", False),
    "o_bias": ("self_attn.o_proj.bias", False),
}
MAMBA_LAYERS = {
    "in_proj": ("mamba.in_proj.weight", True),
    "in_proj_bias": ("mamba.in_proj.bias", False),
    "conv1d": ("mamba.conv1d.weight", False),  # [channels, 1, kernel], as stored
    "conv1d_bias": ("mamba.conv1d.bias", False),
    "dt_bias": ("mamba.dt_bias", False),
    "A_log": ("mamba.A_log", False),
    "D": ("mamba.D", False),
    "mamba_norm": ("mamba.norm.weight", False),
    "out_proj": ("mamba.out_proj.weight", True),
    "out_proj_bias": ("mamba.out_proj.bias", False),
}


def granite_hybrid_param_sources(spec: GraniteHybridSpec) -> dict[tuple[str, ...], ParamSource]:
    sources = {
        ("embed_tokens",): single("model.embed_tokens.weight"),
        ("final_norm",): single("model.norm.weight"),
        ("lm_head",): single("lm_head.weight", transpose=True),
    }
    for table, layers in ((EVERY_LAYER, spec.num_layers), (ATTENTION_LAYERS, spec.attention_layers),
                          (MAMBA_LAYERS, spec.recurrent_layers)):
        for name, (suffix, transpose) in table.items():
            sources[("layers", name)] = per_layer(f"model.layers.{{layer}}.{suffix}", layers, transpose)
    size, fused = spec.shared_intermediate_size, "model.layers.{layer}.shared_mlp.input_linear.weight"
    sources[("layers", "gate_proj")] = fused_part(fused, spec.num_layers, 0, 2 * size)
    sources[("layers", "up_proj")] = fused_part(fused, spec.num_layers, size, 2 * size)
    return sources

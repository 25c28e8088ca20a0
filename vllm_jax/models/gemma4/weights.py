"""Gemma 4 (text) params by HF tensor name: each layer group's stacked params (models/gemma4/model.py) read from its
layers' tensors (the MoE block's stacked experts split / transposed as they load), the per-layer-input (PLE)
tensors, and the tied embedding / final norm."""

from __future__ import annotations

from vllm_jax.models.fused_weights import expert_part
from vllm_jax.models.gemma4.model import group_shapes, layer_groups
from vllm_jax.models.gemma4.spec import Gemma4Spec
from vllm_jax.models.param_source import ParamSource, per_layer, single

# our per-group layer param -> (HF suffix under model.layers.{layer}., transpose)
_LAYER_TENSORS: dict[str, tuple[str, bool]] = {
    "input_norm": ("input_layernorm.weight", False),
    "post_attention_norm": ("post_attention_layernorm.weight", False),
    "pre_feedforward_norm": ("pre_feedforward_layernorm.weight", False),
    "post_feedforward_norm": ("post_feedforward_layernorm.weight", False),
    "q_proj": ("self_attn.q_proj.weight", True),
    "k_proj": ("self_attn.k_proj.weight", True),
    "v_proj": ("self_attn.v_proj.weight", True),
    "o_proj": ("self_attn.o_proj.weight", True),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
    "gate_proj": ("mlp.gate_proj.weight", True),
    "up_proj": ("mlp.up_proj.weight", True),
    "down_proj": ("mlp.down_proj.weight", True),
    "layer_scalar": ("layer_scalar", False),
    "per_layer_input_gate": ("per_layer_input_gate.weight", True),
    "per_layer_projection": ("per_layer_projection.weight", True),
    "post_per_layer_input_norm": ("post_per_layer_input_norm.weight", False),
    # the MoE block (models/gemma4/moe_block.py); its experts come from the stacked tensors (below)
    "router": ("router.proj.weight", True),
    "router_norm": ("router.scale", False),
    "per_expert_scale": ("router.per_expert_scale", False),
    "pre_feedforward_norm_2": ("pre_feedforward_layernorm_2.weight", False),
    "post_feedforward_norm_1": ("post_feedforward_layernorm_1.weight", False),
    "post_feedforward_norm_2": ("post_feedforward_layernorm_2.weight", False),
}


def gemma4_param_sources(spec: Gemma4Spec) -> dict[tuple[str, ...], ParamSource]:
    """Every param the Gemma 4 model has; the loader uses the entries its param tree contains."""
    sources = {
        ("embed_tokens",): single("model.embed_tokens.weight"),
        ("final_norm",): single("model.norm.weight"),
        ("lm_head",): single("lm_head.weight", transpose=True),
        ("embed_tokens_per_layer",): single("model.embed_tokens_per_layer.weight"),
        ("per_layer_model_projection",): single("model.per_layer_model_projection.weight", transpose=True),
        ("per_layer_projection_norm",): single("model.per_layer_projection_norm.weight"),
    }
    for group, layers in layer_groups(spec).items():
        for name in group_shapes(spec, group, layers):
            if name in _EXPERT_TENSORS:
                continue
            suffix, transpose = _LAYER_TENSORS[name]
            sources[("layers", f"{group}_{name}")] = per_layer(f"model.layers.{{layer}}.{suffix}", layers, transpose)
        if spec.num_experts is not None:
            sources |= {("layers", f"{group}_{name}"): source for name, source in _expert_sources(spec, layers).items()}
    return sources


_EXPERT_TENSORS = ("experts_gate", "experts_up", "experts_down")


def _expert_sources(spec: Gemma4Spec, layers: list[int]) -> dict[str, ParamSource]:
    """experts.gate_up_proj [E, 2I, H] split into gate (rows 0 .. I) and up (rows I .. 2I), each [E, H, I];
    experts.down_proj [E, H, I] as [E, I, H]."""
    i, h = spec.moe_intermediate_size, spec.hidden_size
    gate_up = "model.layers.{layer}.experts.gate_up_proj"
    return {"experts_gate": expert_part(gate_up, layers, 0, 2 * i),
            "experts_up": expert_part(gate_up, layers, i, 2 * i),
            "experts_down": expert_part("model.layers.{layer}.experts.down_proj", layers, 0, h)}

"""DeepSeek-V2 / V3's params by HF tensor name (per-expert layout, as published checkpoints and transformers 5's
save_pretrained write them):

    model.layers.{i}.self_attn.q_proj | q_a_proj, q_a_layernorm, q_b_proj   -> layers/q_proj | q_a_proj, q_a_norm,
                                                                               q_b_proj
    model.layers.{i}.self_attn.kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj -> layers/kv_a_proj, kv_a_norm,
                                                                               kv_b_proj ([kv_lora, H * (nope + v)])
    model.layers.{i}.mlp.gate.weight [E, H], gate.e_score_correction_bias    -> layers/router, e_score_bias
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight              -> layers/experts_{gate,up,down}
    model.layers.{i}.mlp.shared_experts.{gate,up,down}_proj.weight           -> layers/shared_{gate,up,down}
    model.layers.{i}.mlp.{gate,up,down}_proj.weight (first dense layers)     -> layers/{gate,up,down}_proj

Embeddings, norms and the LM head are the dense decoder's. The multi-token-prediction layer some checkpoints
carry (model.layers.{num_hidden_layers}) is not read.
"""

from __future__ import annotations

from vllm_jax.models.deepseek.spec import MlaSpec
from vllm_jax.models.param_source import ParamSource, per_layer, per_layer_expert, single

# our attention param -> (HF suffix under model.layers.{layer}.self_attn., transpose)
_ATTENTION = {
    "q_proj": ("q_proj.weight", True),
    "q_a_proj": ("q_a_proj.weight", True),
    "q_a_norm": ("q_a_layernorm.weight", False),
    "q_b_proj": ("q_b_proj.weight", True),
    "kv_a_proj": ("kv_a_proj_with_mqa.weight", True),
    "kv_a_norm": ("kv_a_layernorm.weight", False),
    "kv_b_proj": ("kv_b_proj.weight", True),
    "o_proj": ("o_proj.weight", True),
}


def deepseek_param_sources(spec: MlaSpec) -> dict[tuple[str, ...], ParamSource]:
    """Every param a DeepSeek model may have; the loader uses the entries its param tree contains."""
    n, moe_ids, dense_ids = spec.num_layers, spec.moe_layer_ids, spec.dense_layer_ids
    layer = "model.layers.{layer}"
    sources = {
        ("embed_tokens",): single("model.embed_tokens.weight"),
        ("final_norm",): single("model.norm.weight"),
        ("lm_head",): single("lm_head.weight", transpose=True),
        ("layers", "input_norm"): per_layer(f"{layer}.input_layernorm.weight", n),
        ("layers", "post_attention_norm"): per_layer(f"{layer}.post_attention_layernorm.weight", n),
        ("layers", "router"): per_layer(f"{layer}.mlp.gate.weight", moe_ids, transpose=True),
        ("layers", "e_score_bias"): per_layer(f"{layer}.mlp.gate.e_score_correction_bias", moe_ids),
    }
    for name, (suffix, transpose) in _ATTENTION.items():
        sources[("layers", name)] = per_layer(f"{layer}.self_attn.{suffix}", n, transpose)
    for kind in ("gate", "up", "down"):
        sources[("layers", f"{kind}_proj")] = per_layer(f"{layer}.mlp.{kind}_proj.weight", dense_ids, True)
        sources[("layers", f"shared_{kind}")] = per_layer(f"{layer}.mlp.shared_experts.{kind}_proj.weight", moe_ids,
                                                          True)
        sources[("layers", f"experts_{kind}")] = per_layer_expert(f"{layer}.mlp.experts.{{expert}}.{kind}_proj.weight",
                                                                  moe_ids, spec.num_experts, transpose=True)
    return sources

"""The MoE decoder's params by HF tensor name.

Both architectures are loaded from the per-expert layout, which is what published checkpoints use and what
transformers 5's `save_pretrained` writes by default (it converts its fused in-memory `experts.gate_up_proj`
back to the original names):

    Mixtral    model.layers.{i}.block_sparse_moe.gate.weight              [E, H]  -> layers/router [., H, E]
               model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight    [I, H]  -> layers/experts_gate
               model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight    [I, H]  -> layers/experts_up
               model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight    [H, I]  -> layers/experts_down
    Qwen3-MoE  model.layers.{i}.mlp.gate.weight, mlp.experts.{e}.{gate,up,down}_proj.weight (same shapes);
               dense layers: model.layers.{i}.mlp.{gate,up,down}_proj.weight

The attention half, embeddings, final norm and LM head are the dense decoder's.
"""

from __future__ import annotations

from vllm_jax.model.moe_spec import MoeSpec
from vllm_jax.models.llama.weights import decoder_param_sources
from vllm_jax.models.param_source import ParamSource, per_layer, per_layer_expert

# architecture -> (MoE block prefix under model.layers.{layer}., expert gate / up / down names)
_EXPERT_NAMES = {
    "MixtralForCausalLM": ("block_sparse_moe", ("w1", "w3", "w2")),
    "Qwen3MoeForCausalLM": ("mlp", ("gate_proj", "up_proj", "down_proj")),
}


def moe_param_sources(spec: MoeSpec) -> dict[tuple[str, ...], ParamSource]:
    """Every param the MoE model may have; the loader uses the entries its param tree actually contains."""
    sources = decoder_param_sources(spec)  # attention, norms, embeddings, LM head (+ dense MLP, replaced below)
    moe_ids, dense_ids = spec.moe_layer_ids, spec.dense_layer_ids
    for name in ("gate_proj", "up_proj", "down_proj"):
        sources[("layers", name)] = per_layer(f"model.layers.{{layer}}.mlp.{name}.weight", dense_ids, True)
    prefix, (gate, up, down) = _EXPERT_NAMES[spec.architecture]
    block = f"model.layers.{{layer}}.{prefix}"
    sources[("layers", "router")] = per_layer(f"{block}.gate.weight", moe_ids, transpose=True)
    for param, hf_name in (("experts_gate", gate), ("experts_up", up), ("experts_down", down)):
        sources[("layers", param)] = per_layer_expert(f"{block}.experts.{{expert}}.{hf_name}.weight", moe_ids,
                                                      spec.num_experts, transpose=True)
    return sources

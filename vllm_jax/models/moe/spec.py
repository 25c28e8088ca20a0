"""The MoE family's spec (Mixtral, Qwen3-MoE: a MoeSpec, model/moe_spec.py), read once from a transformers config.

Routing follows each architecture's transformers code:

- Mixtral: softmax(router logits, float32) -> top-k -> renormalize to sum 1; the weights stay float32.
- Qwen3-MoE: softmax(float32) -> top-k -> renormalize only when `norm_topk_prob`; the weights are then cast to
  the model dtype. Layers listed in `mlp_only_layers`, or not on the `decoder_sparse_step` grid, are dense MLPs
  of `intermediate_size` (the config's), kept in `dense_intermediate_size`.
"""

from __future__ import annotations

from typing import Any

from vllm_jax.model.moe_spec import MoeSpec
from vllm_jax.model.spec import common_spec_fields, pick_architecture

MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen3MoeForCausalLM")


def moe_spec_from_hf_config(config: Any) -> MoeSpec:
    arch = pick_architecture(config, MOE_ARCHITECTURES)
    common = common_spec_fields(config, arch)
    n = common["num_layers"]
    if arch == "MixtralForCausalLM":
        num_experts, expert_size = config.num_local_experts, config.intermediate_size
        moe_layers = (True,) * n
        norm_topk, round_weights, attention_bias, qk_norm = True, False, False, False
    else:
        num_experts, expert_size = config.num_experts, config.moe_intermediate_size
        step = int(getattr(config, "decoder_sparse_step", 1) or 1)
        mlp_only = set(getattr(config, "mlp_only_layers", None) or [])
        moe_layers = tuple(i not in mlp_only and num_experts > 0 and (i + 1) % step == 0 for i in range(n))
        norm_topk, round_weights = bool(config.norm_topk_prob), True
        attention_bias, qk_norm = bool(getattr(config, "attention_bias", False)), True
    top_k = config.num_experts_per_tok
    if any(moe_layers) and not 1 <= top_k <= num_experts:
        raise ValueError(f"{arch}: num_experts_per_tok ({top_k}) must be between 1 and the number of experts "
                         f"({num_experts})")
    return MoeSpec(
        **common, intermediate_size=expert_size, qkv_bias=attention_bias, o_bias=attention_bias, mlp_bias=False,
        qk_norm=qk_norm, num_experts=num_experts, num_experts_per_tok=top_k, norm_topk_prob=norm_topk,
        round_router_weights=round_weights, moe_layers=moe_layers,
        dense_intermediate_size=0 if all(moe_layers) else config.intermediate_size)

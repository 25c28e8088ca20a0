"""GptOssSpec: the facts gpt-oss (`GptOssForCausalLM`) adds to an MoE decoder, read once from a transformers config.

What differs from Mixtral / Qwen3-MoE (docs/architecture/12-families.md, "gpt-oss"): attention with biases on q/k/v/o
and a learned sink logit per query head; sliding-window and full attention alternating by `layer_types`; YaRN rope; a
router with a bias whose top-k logits (not probabilities) are softmaxed; experts with biases and a clamped
SwiGLU `(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)`, g = min(gate, limit), gate and up interleaved in
one fused projection. Published checkpoints store the experts in MXFP4: they are dequantized to the model dtype
at load (model_loader/mxfp4_checkpoint.py); keeping them packed is not built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_jax.model.moe_spec import MoeSpec
from vllm_jax.model.spec import common_spec_fields, pick_architecture

GPT_OSS_ARCHITECTURES = ("GptOssForCausalLM",)


@dataclass(frozen=True)
class GptOssSpec(MoeSpec):
    # the clamped SwiGLU's sigmoid gain (swiglu_alpha, 1.702)
    swiglu_alpha: float = field(default=1.702, kw_only=True)
    # the clamp on gate (above) and up (both sides) (swiglu_limit, 7.0)
    swiglu_limit: float = field(default=7.0, kw_only=True)


def gpt_oss_spec_from_hf_config(config: Any) -> GptOssSpec:
    arch = pick_architecture(config, GPT_OSS_ARCHITECTURES)
    quant = getattr(config, "quantization_config", None)
    method = (quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)) \
        if quant else None
    if quant and method != "mxfp4":  # MXFP4 experts are dequantized at load (model_loader/mxfp4_checkpoint.py)
        raise ValueError(f"{arch}: quantization_config quant_method {method!r} is not supported (gpt-oss loads "
                         "float experts or the published MXFP4 ones)")
    common = common_spec_fields(config, arch)
    n = common["num_layers"]
    num_experts, top_k = config.num_local_experts, config.num_experts_per_tok
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"{arch}: num_experts_per_tok ({top_k}) must be between 1 and num_local_experts "
                         f"({num_experts})")
    bias = bool(getattr(config, "attention_bias", True))
    return GptOssSpec(
        **common, intermediate_size=config.intermediate_size, qkv_bias=bias, o_bias=bias, mlp_bias=False,
        qk_norm=False, num_experts=num_experts, num_experts_per_tok=top_k, norm_topk_prob=True,
        round_router_weights=True, moe_layers=(True,) * n, dense_intermediate_size=0,
        swiglu_alpha=float(config.swiglu_alpha), swiglu_limit=float(config.swiglu_limit))

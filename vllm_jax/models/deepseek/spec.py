"""MlaSpec: DeepSeek-V2 / V3's facts (multi-head latent attention, MoE with shared experts and grouped routing),
read once from a transformers config.

It extends MoeSpec, so the runner and the MoE layer loop read the same fields: `intermediate_size` is one routed
expert's FFN size (`moe_intermediate_size`), `dense_intermediate_size` the first `first_k_dense_replace` layers'
MLP. For the shared fields `num_kv_heads` is 1 (the latent is one row shared by every head) and `head_dim` the
rope part (`qk_rope_head_dim`, what the rotary tables cover); the KV cache row is kv_lora_rank + qk_rope_head_dim
wide, padded to a multiple of 128 (docs/architecture/04-kv-cache.md, "KV cache layout").

Routing, as transformers computes it:
- V3 (`noaux_tc`): sigmoid scores; experts chosen by scores + `e_score_correction_bias` among the `topk_group`
  groups (of `n_group`) with the largest sum of their two best biased scores; weights are the unbiased scores,
  renormalized when `norm_topk_prob`, times `routed_scaling_factor`.
- V2: softmax scores; `greedy` top-k, or `group_limited_greedy` (the `topk_group` groups with the largest single
  score); times `routed_scaling_factor`. transformers' V2 ignores `norm_topk_prob`; we honour it as DeepSeek's
  own code and vLLM do (published V2 checkpoints set it false, where the two agree).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vllm_jax.model.moe_spec import MoeSpec
from vllm_jax.model.rope import rope_inv_freq
from vllm_jax.model.spec import pick_architecture, rope_parameters_of

KV_ROW_ALIGN = 128  # lanes of a TPU vreg: the cache row's width is padded to a multiple of it
MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
_TOPK_METHODS = {"DeepseekV2ForCausalLM": ("greedy", "group_limited_greedy"),
                 "DeepseekV3ForCausalLM": ("noaux_tc",)}


@dataclass(frozen=True)
class MlaSpec(MoeSpec):
    q_lora_rank: int | None  # None: a plain q_proj (DeepSeek-V2-Lite)
    kv_lora_rank: int  # width of the compressed latent c_kv (the cached part shared by all heads)
    qk_nope_head_dim: int  # per-head query/key width without rotary (absorbed into latent space for attention)
    qk_rope_head_dim: int  # the rotary part, one key row shared by all heads
    v_head_dim: int
    rope_interleave: bool  # rotary dims in interleaved pairs (V2 always; V3 unless rope_interleave is false)
    shared_intermediate_size: int  # moe_intermediate_size * n_shared_experts (0: no shared experts)
    n_group: int  # expert groups for group-limited routing (1: no grouping)
    topk_group: int  # groups kept per token
    routed_scaling_factor: float
    topk_method: str  # noaux_tc (V3: sigmoid + bias), greedy / group_limited_greedy (V2: softmax)

    @property
    def kv_cache_heads(self) -> int:
        return 1

    @property
    def kv_cache_width(self) -> int:
        """The latent row, padded to a multiple of 128 lanes: XLA:TPU relayouts (copies) the whole cache at every
        gather or scatter of a row that is not lane-aligned (DeepSeek's 576 -> 640;
        docs/architecture/04-kv-cache.md, "KV cache layout")."""
        return -(-(self.kv_lora_rank + self.qk_rope_head_dim) // KV_ROW_ALIGN) * KV_ROW_ALIGN

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def yarn_softmax_scale(rope: dict, qk_head_dim: int) -> float:
    """transformers' `yarn_apply_mscale`: qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim) squared when
    the rope is scaled (not "default") and sets `mscale_all_dim`."""
    scale = qk_head_dim ** -0.5
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim", 0):
        factor = float(rope["factor"])
        mscale = 1.0 if factor <= 1 else 0.1 * float(rope["mscale_all_dim"]) * math.log(factor) + 1.0
        scale = scale * mscale * mscale
    return scale


def mla_spec_from_hf_config(config: Any) -> MlaSpec:
    arch = pick_architecture(config, MLA_ARCHITECTURES)
    act = getattr(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"{arch}: hidden_act {act!r} is not supported (only silu)")
    if getattr(config, "attention_bias", False):
        raise ValueError(f"{arch}: attention_bias=True is not supported (DeepSeek checkpoints have none)")
    n = config.num_hidden_layers
    rope_dim = config.qk_rope_head_dim
    rope = rope_parameters_of(config)
    inv_freq, rope_scaling = rope_inv_freq(rope, rope_dim)
    num_experts = config.n_routed_experts
    top_k = config.num_experts_per_tok
    first_dense = int(getattr(config, "first_k_dense_replace", 0) or 0)
    moe_layers = tuple(i >= first_dense and num_experts > 0 for i in range(n))
    if any(moe_layers) and not 1 <= top_k <= num_experts:
        raise ValueError(f"{arch}: num_experts_per_tok ({top_k}) must be between 1 and n_routed_experts "
                         f"({num_experts})")
    topk_method = getattr(config, "topk_method", None) or _TOPK_METHODS[arch][0]
    if arch == "DeepseekV3ForCausalLM":
        topk_method = "noaux_tc"  # transformers' V3 router has only this one
    if topk_method not in _TOPK_METHODS[arch]:
        raise ValueError(f"{arch}: topk_method {topk_method!r} is not supported "
                         f"(supported: {', '.join(_TOPK_METHODS[arch])})")
    grouped = topk_method != "greedy"
    n_group = int(getattr(config, "n_group", None) or 1) if grouped else 1
    topk_group = int(getattr(config, "topk_group", None) or n_group) if grouped else 1
    if num_experts % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"{arch}: n_group ({n_group}) must divide n_routed_experts ({num_experts}) and "
                         f"topk_group ({topk_group}) be between 1 and n_group")
    if topk_method == "noaux_tc" and num_experts // n_group < 2:
        raise ValueError(f"{arch}: noaux_tc routing scores each group by its two best experts; n_group "
                         f"({n_group}) leaves fewer than 2 experts per group")
    qk_head_dim = config.qk_nope_head_dim + rope_dim
    shared = int(getattr(config, "n_shared_experts", 0) or 0) * config.moe_intermediate_size
    return MlaSpec(
        architecture=arch, vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.moe_intermediate_size, num_layers=n, num_heads=config.num_attention_heads,
        num_kv_heads=1, head_dim=rope_dim, rms_norm_eps=float(config.rms_norm_eps),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)), qkv_bias=False, o_bias=False,
        mlp_bias=False, qk_norm=False, sliding_windows=(0,) * n, inv_freq=tuple(float(x) for x in inv_freq),
        rope_attention_scaling=rope_scaling, attention_scale=yarn_softmax_scale(rope, qk_head_dim),
        num_experts=num_experts, num_experts_per_tok=top_k,
        norm_topk_prob=bool(getattr(config, "norm_topk_prob", False)), round_router_weights=False,
        moe_layers=moe_layers, dense_intermediate_size=config.intermediate_size if first_dense else 0,
        q_lora_rank=getattr(config, "q_lora_rank", None), kv_lora_rank=config.kv_lora_rank,
        qk_nope_head_dim=config.qk_nope_head_dim, qk_rope_head_dim=rope_dim, v_head_dim=config.v_head_dim,
        rope_interleave=arch == "DeepseekV2ForCausalLM" or bool(getattr(config, "rope_interleave", True)),
        shared_intermediate_size=shared, n_group=n_group, topk_group=topk_group,
        routed_scaling_factor=float(getattr(config, "routed_scaling_factor", 1.0)), topk_method=topk_method)

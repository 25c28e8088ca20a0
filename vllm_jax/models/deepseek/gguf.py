"""GGUF files of DeepSeek-V2 / V3 (llama.cpp's `deepseek2`): what its converter changed, undone
(docs/architecture/13-gguf.md, "GGUF files of the MoE families").

Tensors: the experts `mlp.experts.{e}.{gate,up,down}_proj.weight` were stacked into `ffn_*_exps` [E, out, in] (our
weight map reads them per expert); `kv_b_proj` [H * (nope + v), kv_lora] is, from current converters, split per
head into `attn_k_b` [H, kv_lora, nope] (transposed) and `attn_v_b` [H, v, kv_lora] (older files: one `attn_kv_b`).
The routing bias is `exp_probs_b.bias`. The q/k rows are not permuted (llama.cpp runs DeepSeek's rope on adjacent
pairs, as the weights are).

Config: expert counts and sizes, the MLA ranks and head lengths (`key_length` / `value_length` are the cache's
latent widths there; the per-head sizes are the `*_mla` keys), the gating function (1 softmax: V2, 2 sigmoid: V3;
absent means softmax, as llama.cpp reads old V2 files), YaRN's `yarn_log_multiplier` (0.1 * mscale_all_dim).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_jax.models.gguf_family import GgufArch, GgufError, field, float32_decimal
from vllm_jax.models.gguf_stacked import StackedTensors, required

_V3_GATING = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (1: softmax)


class DeepseekTensors(StackedTensors):
    ONE_TO_ONE = {
        "attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
        "attn_q": "self_attn.q_proj.weight", "attn_q_a": "self_attn.q_a_proj.weight",
        "attn_q_a_norm": "self_attn.q_a_layernorm.weight", "attn_q_b": "self_attn.q_b_proj.weight",
        "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_norm": "self_attn.kv_a_layernorm.weight",
        "attn_kv_b": "self_attn.kv_b_proj.weight", "attn_output": "self_attn.o_proj.weight",
        "ffn_gate_inp": "mlp.gate.weight", "exp_probs_b": "mlp.gate.e_score_correction_bias",
        "ffn_gate": "mlp.gate_proj.weight", "ffn_up": "mlp.up_proj.weight", "ffn_down": "mlp.down_proj.weight",
        "ffn_gate_shexp": "mlp.shared_experts.gate_proj.weight", "ffn_up_shexp": "mlp.shared_experts.up_proj.weight",
        "ffn_down_shexp": "mlp.shared_experts.down_proj.weight",
    }
    PARTS = ("attn_k_b", "attn_v_b", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps")

    def __init__(self, path: str, num_layers: int):
        super().__init__(path, num_layers)
        self._has_kv_b: set[int] = set()

    def _one_to_one(self, layer: int, stem: str, kind: str, array: np.ndarray) -> np.ndarray:
        if stem == "attn_kv_b":
            self._has_kv_b.add(layer)
            self._parts.pop((layer, "kv_b"), None)  # a file with both: kv_b is the HF tensor itself
        return array

    def _combine(self, prefix: str, layer: int, stem: str, kind: str,
                 array: np.ndarray) -> list[tuple[str, np.ndarray]]:
        if stem in ("attn_k_b", "attn_v_b"):
            if layer in self._has_kv_b:
                return []
            got = self._collect((layer, "kv_b"), stem, array, ("attn_k_b", "attn_v_b"))
            if got is None:
                return []
            k_b, v_b = got  # [H, kv_lora, nope], [H, v, kv_lora]
            kv_b = np.concatenate([k_b.swapaxes(1, 2), v_b], axis=1)  # [H, nope + v, kv_lora]
            return [(prefix + "self_attn.kv_b_proj.weight", kv_b.reshape(-1, kv_b.shape[-1]))]
        if stem == "ffn_gate_up_exps":
            gate, up = np.split(array, 2, axis=1)
            return _per_expert(prefix, "gate_proj", gate) + _per_expert(prefix, "up_proj", up)
        return _per_expert(prefix, stem.removeprefix("ffn_").removesuffix("_exps") + "_proj", array)


def _per_expert(prefix: str, proj: str, stack: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """A stack [E, out, in] as HF's per-expert tensors (views of it)."""
    return [(f"{prefix}mlp.experts.{e}.{proj}.weight", stack[e]) for e in range(stack.shape[0])]


def deepseek_config_class(reader: Any) -> tuple[str, str]:
    """deepseek2 holds V2 and V3: V3 routes by sigmoid (its gating function key, or a routing bias present)."""
    sigmoid = field(reader, "deepseek2.expert_gating_func") == _V3_GATING or any(
        t.name.startswith("blk.") and ".exp_probs_b." in t.name for t in reader.tensors)
    return ("DeepseekV3Config", "DeepseekV3ForCausalLM") if sigmoid else ("DeepseekV2Config", "DeepseekV2ForCausalLM")


def deepseek_config(reader: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The HF config fields of DeepSeek from its keys; rewrites the generic `kwargs` (head_dim, KV heads, rope
    parameters) in place where DeepSeek means something else by them."""
    path = reader.data.filename
    out = {"num_experts_per_tok": required(reader, "deepseek2", "expert_used_count")}
    return {**out, **_deepseek2(reader, kwargs, path)}


def _deepseek2(reader: Any, kwargs: dict[str, Any], path: str) -> dict[str, Any]:
    arch = "deepseek2"
    rope_dim = required(reader, arch, "rope.dimension_count")
    kv_lora = field(reader, f"{arch}.attention.kv_lora_rank")
    key_mla = field(reader, f"{arch}.attention.key_length_mla")
    value_mla = field(reader, f"{arch}.attention.value_length_mla")
    if key_mla is None:  # converters before the *_mla keys wrote the per-head lengths as key / value_length
        key_mla = field(reader, f"{arch}.attention.key_length")
        value_mla = field(reader, f"{arch}.attention.value_length")
    for value, key in ((kv_lora, "attention.kv_lora_rank"), (key_mla, "attention.key_length_mla"),
                       (value_mla, "attention.value_length_mla")):
        if value is None:
            raise GgufError(f"{path}: GGUF metadata lacks {arch}.{key}, needed for the {arch} model")
    experts = field(reader, f"{arch}.expert_count") or 0
    heads = kwargs["num_attention_heads"]
    kwargs["head_dim"] = rope_dim
    kwargs["num_key_value_heads"] = heads  # llama.cpp writes 1 (MLA as MQA); HF's config repeats K/V per head
    kwargs.pop("sliding_window", None)
    sigmoid = deepseek_config_class(reader)[0] == "DeepseekV3Config"
    n_group = int(field(reader, f"{arch}.expert_group_count") or 1)
    out: dict[str, Any] = {
        "kv_lora_rank": int(kv_lora), "q_lora_rank": field(reader, f"{arch}.attention.q_lora_rank"),
        "qk_rope_head_dim": int(rope_dim), "qk_nope_head_dim": int(key_mla) - int(rope_dim),
        "v_head_dim": int(value_mla), "n_routed_experts": int(experts),
        "moe_intermediate_size": field(reader, f"{arch}.expert_feed_forward_length") or kwargs["intermediate_size"],
        "n_shared_experts": int(field(reader, f"{arch}.expert_shared_count") or 0),
        "first_k_dense_replace": int(field(reader, f"{arch}.leading_dense_block_count") or 0),
        "routed_scaling_factor": float32_decimal(field(reader, f"{arch}.expert_weights_scale", 1.0)),
        "norm_topk_prob": bool(field(reader, f"{arch}.expert_weights_norm", False)),
        "n_group": n_group, "topk_group": int(field(reader, f"{arch}.expert_group_used_count") or n_group),
    }
    if not sigmoid:
        out["topk_method"] = "group_limited_greedy" if n_group > 1 else "greedy"
    rope = kwargs["rope_parameters"]
    log_mul = field(reader, f"{arch}.rope.scaling.yarn_log_multiplier")
    if rope.get("rope_type") == "yarn" and log_mul:
        # llama.cpp keeps 0.1 * mscale_all_dim and applies it as both of HF's mscale and mscale_all_dim
        mscale = float32_decimal(float(np.float32(log_mul)) / 0.1)
        rope.update(mscale=mscale, mscale_all_dim=mscale)
    return out


GGUF_ARCHS = (GgufArch("deepseek2", "DeepseekV3Config", "DeepseekV3ForCausalLM", config=deepseek_config,
                       config_class_of=deepseek_config_class, tensors=DeepseekTensors, keeps_blocks=False),)

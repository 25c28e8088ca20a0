"""GGUF files of gpt-oss (`gpt-oss`) and DeepSeek-V2 / V3 (`deepseek2`): what llama.cpp's converter changed,
undone (docs/architecture/13-gguf.md, "GGUF files of the MoE families").

Tensors. llama.cpp stacks and splits what HF keeps otherwise, so here one GGUF tensor may give several HF
tensors and several GGUF tensors one (`MoeTensors` buffers the parts until a whole HF tensor can be built):
- gpt-oss: HF's fused `gate_up_proj` [E, H, 2I] (gate / up interleaved on the columns, [in, out]) was
  de-interleaved and transposed into `ffn_gate_exps` / `ffn_up_exps` [E, I, H] (or, newer converters with
  --fuse-gate-up-exps, one `ffn_gate_up_exps` [E, 2I, H]: all gate rows, then all up rows), its bias likewise;
  `down_proj` [E, I, H] was transposed to `ffn_down_exps` [E, H, I]. Expert weights may be MXFP4 (gguf-py
  dequantizes them). The sinks are `attn_sinks.weight`; the router is `ffn_gate_inp` with its bias.
- deepseek2: the experts `mlp.experts.{e}.{gate,up,down}_proj.weight` were stacked into `ffn_*_exps` [E, out, in]
  (our weight map reads them per expert); `kv_b_proj` [H * (nope + v), kv_lora] is, from current converters,
  split per head into `attn_k_b` [H, kv_lora, nope] (transposed) and `attn_v_b` [H, v, kv_lora] (older files:
  one `attn_kv_b`). The routing bias is `exp_probs_b.bias`.
Neither family's q/k rows are permuted (llama.cpp runs DeepSeek's rope on adjacent pairs, as the weights are).

Config. Keys llama.cpp writes for these families: expert counts and sizes, the MLA ranks and head lengths
(`key_length` / `value_length` are the cache's latent widths there; the per-head sizes are the `*_mla` keys),
the gating function (1 softmax: V2, 2 sigmoid: V3; absent means softmax, as llama.cpp reads old V2 files),
YaRN's `yarn_log_multiplier` (0.1 * mscale_all_dim for deepseek2). gpt-oss's layer pattern (sliding on even
layers) and SwiGLU limit (7.0) are fixed in llama.cpp; `attention.sliding_window_pattern` / `swiglu_clamp_exp`
are read when a file has them.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from vllm_jax.model_loader.gguf_file.names import GLOBAL_NAMES
from vllm_jax.model_loader.gguf_file.reader import field, float32_decimal
from vllm_jax.model_loader.source import ModelSourceError

MOE_ARCHITECTURES = ("gpt-oss", "deepseek2")
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# GGUF block tensor stem -> HF name under model.layers.{i}. ("{kind}": weight / bias), for 1:1 tensors
_ONE_TO_ONE: dict[str, dict[str, str]] = {
    "gpt-oss": {
        "attn_norm": "input_layernorm.{kind}", "post_attention_norm": "post_attention_layernorm.{kind}",
        "attn_q": "self_attn.q_proj.{kind}", "attn_k": "self_attn.k_proj.{kind}",
        "attn_v": "self_attn.v_proj.{kind}", "attn_output": "self_attn.o_proj.{kind}",
        "attn_sinks": "self_attn.sinks", "ffn_gate_inp": "mlp.router.{kind}",
        "ffn_down_exps": "mlp.experts.down_proj{bias}",  # transposed below (weight)
    },
    "deepseek2": {
        "attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
        "attn_q": "self_attn.q_proj.weight", "attn_q_a": "self_attn.q_a_proj.weight",
        "attn_q_a_norm": "self_attn.q_a_layernorm.weight", "attn_q_b": "self_attn.q_b_proj.weight",
        "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_norm": "self_attn.kv_a_layernorm.weight",
        "attn_kv_b": "self_attn.kv_b_proj.weight", "attn_output": "self_attn.o_proj.weight",
        "ffn_gate_inp": "mlp.gate.weight", "exp_probs_b": "mlp.gate.e_score_correction_bias",
        "ffn_gate": "mlp.gate_proj.weight", "ffn_up": "mlp.up_proj.weight", "ffn_down": "mlp.down_proj.weight",
        "ffn_gate_shexp": "mlp.shared_experts.gate_proj.weight", "ffn_up_shexp": "mlp.shared_experts.up_proj.weight",
        "ffn_down_shexp": "mlp.shared_experts.down_proj.weight",
    },
}
# stems whose tensors are combined with others into one HF tensor
_PARTS = {"gpt-oss": ("ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps"),
          "deepseek2": ("attn_k_b", "attn_v_b", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps")}
_V3_GATING = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (1: softmax)


class MoeTensors:
    """GGUF tensors of one file -> HF tensors, fed in file order; `finish` says whether a part was left over."""

    def __init__(self, arch: str, path: str, num_layers: int):
        self.arch, self.path, self.num_layers = arch, path, num_layers
        self._parts: dict[tuple[int, str], dict[str, np.ndarray]] = {}
        self._has_kv_b: set[int] = set()

    def claims(self, gguf_name: str) -> bool:
        """Whether this is a tensor of the family (else it has no HF counterpart: the caller's error)."""
        stem, _, kind = gguf_name.rpartition(".")
        if stem in GLOBAL_NAMES:
            return kind in ("weight", "bias")
        match = _BLOCK_RE.fullmatch(gguf_name)
        return bool(match) and (match.group(2) in _ONE_TO_ONE[self.arch] or match.group(2) in _PARTS[self.arch])

    def skipped(self, gguf_name: str) -> bool:
        """A multi-token-prediction layer's tensor (`blk.{n >= block_count}.*`, `*.nextn.*`): not read (nor
        dequantized), as the safetensors loader skips HF's model.layers.{num_hidden_layers}."""
        layer = re.match(r"blk\.(\d+)\.", gguf_name)
        return ".nextn." in gguf_name or bool(layer) and int(layer.group(1)) >= self.num_layers

    def convert(self, gguf_name: str, array: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """The HF tensors this GGUF tensor completes (none while its partners are still to come)."""
        stem, _, kind = gguf_name.rpartition(".")
        if stem in GLOBAL_NAMES:
            return [(f"{GLOBAL_NAMES[stem]}.{kind}", array)]
        match = _BLOCK_RE.fullmatch(gguf_name)
        layer, stem, kind = int(match.group(1)), match.group(2), match.group(3)
        prefix = f"model.layers.{layer}."
        if stem in _ONE_TO_ONE[self.arch]:
            name = _ONE_TO_ONE[self.arch][stem].format(kind=kind, bias="_bias" if kind == "bias" else "")
            if stem == "ffn_down_exps" and kind == "weight":
                array = np.ascontiguousarray(array.swapaxes(1, 2))  # [E, H, I] -> HF's [E, I, H] ([in, out])
            if stem == "attn_kv_b":
                self._has_kv_b.add(layer)
                self._parts.pop((layer, "kv_b"), None)  # a file with both: kv_b is the HF tensor itself
            return [(prefix + name, array)]
        if self.arch == "gpt-oss":
            return self._gpt_oss_experts(prefix, layer, stem, kind, array)
        return self._deepseek_parts(prefix, layer, stem, array)

    def finish(self) -> None:
        if self._parts:
            (layer, group), parts = next(iter(self._parts.items()))
            raise ModelSourceError(f"{self.path}: blk.{layer} has only {', '.join(sorted(parts))} of its {group} "
                                   "tensors")

    def _collect(self, key: tuple[int, str], part: str, array: np.ndarray, needed: tuple[str, ...]):
        parts = self._parts.setdefault(key, {})
        parts[part] = array
        if set(parts) != set(needed):
            return None
        del self._parts[key]
        return [parts[p] for p in needed]

    def _gpt_oss_experts(self, prefix: str, layer: int, stem: str, kind: str,
                         array: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """gate / up rows -> HF's interleaved gate_up_proj [E, H, 2I] (weight) or gate_up_proj_bias [E, 2I]."""
        if stem == "ffn_gate_up_exps":
            gate, up = np.split(array, 2, axis=1)
        else:
            got = self._collect((layer, f"gate_up {kind}"), stem, array, ("ffn_gate_exps", "ffn_up_exps"))
            if got is None:
                return []
            gate, up = got
        fused = np.stack([gate, up], axis=2).reshape(gate.shape[0], 2 * gate.shape[1], *gate.shape[2:])
        if kind == "bias":
            return [(prefix + "mlp.experts.gate_up_proj_bias", fused)]
        return [(prefix + "mlp.experts.gate_up_proj", np.ascontiguousarray(fused.swapaxes(1, 2)))]

    def _deepseek_parts(self, prefix: str, layer: int, stem: str, array: np.ndarray) -> list[tuple[str, np.ndarray]]:
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


def moe_config_class(reader: Any, arch: str) -> tuple[str, str] | None:
    """deepseek2 holds V2 and V3: V3 routes by sigmoid (its gating function key, or a routing bias present)."""
    if arch != "deepseek2":
        return None
    sigmoid = field(reader, "deepseek2.expert_gating_func") == _V3_GATING or any(
        t.name.startswith("blk.") and ".exp_probs_b." in t.name for t in reader.tensors)
    return ("DeepseekV3Config", "DeepseekV3ForCausalLM") if sigmoid else ("DeepseekV2Config", "DeepseekV2ForCausalLM")


def moe_family_config(reader: Any, arch: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The HF config fields of gpt-oss / DeepSeek from their keys; rewrites the generic `kwargs` (head_dim, KV
    heads, rope parameters) in place where these families mean something else by them."""
    path = reader.data.filename
    out = {"num_experts_per_tok": _required(reader, arch, "expert_used_count", path)}
    if arch == "gpt-oss":
        return {**out, **_gpt_oss(reader, kwargs, path)}
    return {**out, **_deepseek2(reader, kwargs, path)}


def _required(reader: Any, arch: str, key: str, path: str) -> Any:
    value = field(reader, f"{arch}.{key}")
    if value is None:
        raise ModelSourceError(f"{path}: GGUF metadata lacks {arch}.{key}, needed for the {arch} model")
    return value


def _gpt_oss(reader: Any, kwargs: dict[str, Any], path: str) -> dict[str, Any]:
    layers = kwargs["num_hidden_layers"]
    out: dict[str, Any] = {"num_local_experts": _required(reader, "gpt-oss", "expert_count", path)}
    expert_size = field(reader, "gpt-oss.expert_feed_forward_length")
    if expert_size is not None:
        kwargs["intermediate_size"] = expert_size
    pattern = field(reader, "gpt-oss.attention.sliding_window_pattern", 2)  # llama.cpp: every 2nd layer full
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ModelSourceError(f"{path}: gpt-oss.attention.sliding_window_pattern has {len(pattern)} entries for "
                                   f"{layers} layers")
        sliding = [bool(flag) for flag in pattern]
    else:
        sliding = [(i + 1) % int(pattern) != 0 for i in range(layers)]
    out["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
    if not kwargs.get("sliding_window") and any(sliding):
        raise ModelSourceError(f"{path}: GGUF metadata lacks gpt-oss.attention.sliding_window, needed for its "
                               "sliding layers")
    clamp = field(reader, "gpt-oss.swiglu_clamp_exp")
    if clamp is not None:
        limits = {float32_decimal(v) for v in (clamp if isinstance(clamp, list) else [clamp]) if v}
        if len(limits) > 1:
            raise ModelSourceError(f"{path}: gpt-oss.swiglu_clamp_exp differs between layers ({sorted(limits)}); "
                                   "one SwiGLU limit for every layer is supported")
        out["swiglu_limit"] = limits.pop() if limits else 7.0
    rope = kwargs["rope_parameters"]
    if rope.get("rope_type") == "yarn":
        rope["truncate"] = False  # gpt-oss's published config: YaRN's correction range is not rounded
    return out


def _deepseek2(reader: Any, kwargs: dict[str, Any], path: str) -> dict[str, Any]:
    arch = "deepseek2"
    rope_dim = _required(reader, arch, "rope.dimension_count", path)
    kv_lora = field(reader, f"{arch}.attention.kv_lora_rank")
    key_mla = field(reader, f"{arch}.attention.key_length_mla")
    value_mla = field(reader, f"{arch}.attention.value_length_mla")
    if key_mla is None:  # converters before the *_mla keys wrote the per-head lengths as key / value_length
        key_mla = field(reader, f"{arch}.attention.key_length")
        value_mla = field(reader, f"{arch}.attention.value_length")
    for value, key in ((kv_lora, "attention.kv_lora_rank"), (key_mla, "attention.key_length_mla"),
                       (value_mla, "attention.value_length_mla")):
        if value is None:
            raise ModelSourceError(f"{path}: GGUF metadata lacks {arch}.{key}, needed for the {arch} model")
    experts = field(reader, f"{arch}.expert_count") or 0
    heads = kwargs["num_attention_heads"]
    kwargs["head_dim"] = rope_dim
    kwargs["num_key_value_heads"] = heads  # llama.cpp writes 1 (MLA as MQA); HF's config repeats K/V per head
    kwargs.pop("sliding_window", None)
    sigmoid = moe_config_class(reader, arch)[0] == "DeepseekV3Config"
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

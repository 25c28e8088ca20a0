"""GGUF files of gpt-oss (llama.cpp's `gpt-oss`): what its converter changed, undone (docs/architecture/13-gguf.md,
"GGUF files of the MoE families").

Tensors: HF's fused `gate_up_proj` [E, H, 2I] (gate / up interleaved on the columns, [in, out]) was de-interleaved
and transposed into `ffn_gate_exps` / `ffn_up_exps` [E, I, H] (or, newer converters with --fuse-gate-up-exps, one
`ffn_gate_up_exps` [E, 2I, H]: all gate rows, then all up rows), its bias likewise; `down_proj` [E, I, H] was
transposed to `ffn_down_exps` [E, H, I]. Expert weights may be MXFP4 (gguf-py dequantizes them). The sinks are
`attn_sinks.weight`; the router is `ffn_gate_inp` with its bias. The q/k rows are not permuted.

Config: the expert counts and size; the layer pattern (sliding on even layers) and SwiGLU limit (7.0) are fixed in
llama.cpp; `attention.sliding_window_pattern` / `swiglu_clamp_exp` are read when a file has them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_jax.models.gguf_family import GgufArch, GgufError, field, float32_decimal
from vllm_jax.models.gguf_stacked import StackedTensors, required


class GptOssTensors(StackedTensors):
    ONE_TO_ONE = {
        "attn_norm": "input_layernorm.{kind}", "post_attention_norm": "post_attention_layernorm.{kind}",
        "attn_q": "self_attn.q_proj.{kind}", "attn_k": "self_attn.k_proj.{kind}",
        "attn_v": "self_attn.v_proj.{kind}", "attn_output": "self_attn.o_proj.{kind}",
        "attn_sinks": "self_attn.sinks", "ffn_gate_inp": "mlp.router.{kind}",
        "ffn_down_exps": "mlp.experts.down_proj{bias}",  # transposed below (weight)
    }
    PARTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps")

    def _one_to_one(self, layer: int, stem: str, kind: str, array: np.ndarray) -> np.ndarray:
        if stem == "ffn_down_exps" and kind == "weight":
            return np.ascontiguousarray(array.swapaxes(1, 2))  # [E, H, I] -> HF's [E, I, H] ([in, out])
        return array

    def _combine(self, prefix: str, layer: int, stem: str, kind: str,
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


def gpt_oss_config(reader: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The HF config fields of gpt-oss from its keys; rewrites the generic `kwargs` (intermediate size, rope)."""
    path = reader.data.filename
    out: dict[str, Any] = {"num_experts_per_tok": required(reader, "gpt-oss", "expert_used_count")}
    return {**out, **_gpt_oss(reader, kwargs, path)}


def _gpt_oss(reader: Any, kwargs: dict[str, Any], path: str) -> dict[str, Any]:
    layers = kwargs["num_hidden_layers"]
    out: dict[str, Any] = {"num_local_experts": required(reader, "gpt-oss", "expert_count")}
    expert_size = field(reader, "gpt-oss.expert_feed_forward_length")
    if expert_size is not None:
        kwargs["intermediate_size"] = expert_size
    pattern = field(reader, "gpt-oss.attention.sliding_window_pattern", 2)  # llama.cpp: every 2nd layer full
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise GgufError(f"{path}: gpt-oss.attention.sliding_window_pattern has {len(pattern)} entries for "
                                   f"{layers} layers")
        sliding = [bool(flag) for flag in pattern]
    else:
        sliding = [(i + 1) % int(pattern) != 0 for i in range(layers)]
    out["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
    if not kwargs.get("sliding_window") and any(sliding):
        raise GgufError(f"{path}: GGUF metadata lacks gpt-oss.attention.sliding_window, needed for its "
                               "sliding layers")
    clamp = field(reader, "gpt-oss.swiglu_clamp_exp")
    if clamp is not None:
        limits = {float32_decimal(v) for v in (clamp if isinstance(clamp, list) else [clamp]) if v}
        if len(limits) > 1:
            raise GgufError(f"{path}: gpt-oss.swiglu_clamp_exp differs between layers ({sorted(limits)}); "
                                   "one SwiGLU limit for every layer is supported")
        out["swiglu_limit"] = limits.pop() if limits else 7.0
    rope = kwargs["rope_parameters"]
    if rope.get("rope_type") == "yarn":
        rope["truncate"] = False  # gpt-oss's published config: YaRN's correction range is not rounded
    return out


GGUF_ARCHS = (GgufArch("gpt-oss", "GptOssConfig", "GptOssForCausalLM", config=gpt_oss_config, tensors=GptOssTensors,
                       keeps_blocks=False),)

"""Phi-3 (Phi3ForCausalLM): the Llama decoder with fused checkpoint tensors and LongRoPE
(docs/architecture/12-families.md, "Phi-3").

- `self_attn.qkv_proj` ([q | k | v] rows) and `mlp.gate_up_proj` ([gate | up]) are split at load into Llama's
  q/k/v and gate/up params (models/phi3/weights.py), so the model, the partition rules and the quantized
  paths are Llama's;
- `rope_scaling` type "longrope" (transformers' Phi3Config renames the old "su" / "yarn" to it): short and long
  per-frequency factors (model/rope_longrope.py). The spec carries the short frequencies in `inv_freq` and the
  long ones in `long_inv_freq`; `DecoderSpec.for_context` picks per engine.
"""

from __future__ import annotations

from typing import Any

from vllm_jax.model.rope_longrope import longrope_inv_freq, original_context
from vllm_jax.model.spec import DecoderSpec, common_spec_fields, pick_architecture, rope_parameters_of

PHI3_ARCHITECTURES = ("Phi3ForCausalLM",)


def phi3_spec_from_hf_config(config: Any) -> DecoderSpec:
    arch = pick_architecture(config, PHI3_ARCHITECTURES)
    rope = rope_parameters_of(config)
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"{arch}: partial_rotary_factor {rope['partial_rotary_factor']} is not supported (only 1.0)")
    if rope["rope_type"] not in ("default", "longrope"):
        raise ValueError(f"{arch}: rope_type {rope['rope_type']!r} is not supported (default or longrope)")
    common = common_spec_fields(config, arch)
    extra: dict[str, Any] = {}
    if rope["rope_type"] == "longrope":
        long_inv_freq, _ = longrope_inv_freq(rope, common["head_dim"], "long")
        extra = dict(long_inv_freq=tuple(float(x) for x in long_inv_freq),
                     rope_original_max_position=original_context(rope))
    return DecoderSpec(**common, intermediate_size=config.intermediate_size, qkv_bias=False, o_bias=False,
                       mlp_bias=False, qk_norm=False, **extra)

"""GemmaSpec: the facts the Gemma 2 / Gemma 3 (text) decoder needs beyond DecoderSpec, read from a transformers
config (docs/architecture/12-families.md, "Gemma 2 and Gemma 3").

What differs from the Llama family, as transformers' Gemma2 / Gemma3 modeling code does it:

- embeddings times sqrt(hidden_size) (DecoderSpec.embedding_multiplier), softmax scale
  query_pre_attn_scalar ** -0.5 (DecoderSpec.attention_scale);
- RMSNorm scales by (1 + weight), in float32; four norms per layer (input, post-attention, pre- and
  post-feedforward), q/k norms of that kind on Gemma 3;
- GeGLU FFN (gelu, tanh approximation);
- Gemma 2: attention logits soft-capped (cap * tanh(s / cap)) and the final logits too; Gemma 3's attention
  ignores `attn_logit_softcapping` (transformers never passes it to the attention), its final cap applies when set;
- sliding / global layers from `layer_types` (DecoderSpec.sliding_windows); Gemma 3's two kinds have their own
  rope parameters (`rope_parameters[layer_type]`): the global one is DecoderSpec.inv_freq, the sliding one
  `local_inv_freq`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_jax.model.rope import rope_inv_freq
from vllm_jax.model.spec import DecoderSpec, common_spec_fields, pick_architecture

GEMMA_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
# Gemma architectures refused with a reason (models/registry.py) instead of the generic unknown-architecture error
GEMMA_NOT_BUILT = {
    "Gemma4ForConditionalGeneration": "multimodal Gemma 4 is not built: only text-only Gemma4ForCausalLM "
                                      "(model_type gemma4_text) checkpoints load",
    "Gemma3ForConditionalGeneration": "multimodal Gemma 3 is not built: only the text-only Gemma3ForCausalLM "
                                      "(model_type gemma3_text) checkpoints load",
}
_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


@dataclass(frozen=True)
class GemmaSpec(DecoderSpec):
    # cap * tanh(score / cap) on the scaled attention logits; None: no cap (Gemma 3)
    attention_soft_cap: float | None = field(default=None, kw_only=True)
    # cap * tanh(logit / cap) on the final logits; None: no cap
    final_soft_cap: float | None = field(default=None, kw_only=True)
    # rotary inverse frequencies of the sliding-window layers (Gemma 3's local rope base); () = inv_freq's
    local_inv_freq: tuple[float, ...] = field(default=(), kw_only=True)
    # cos/sin multiplier of the sliding-window layers' rope
    local_rope_attention_scaling: float = field(default=1.0, kw_only=True)

    @property
    def separate_local_rope(self) -> bool:
        return bool(self.local_inv_freq) and (self.local_inv_freq, self.local_rope_attention_scaling) != (
            self.inv_freq, self.rope_attention_scaling)


def gemma_spec_from_hf_config(config: Any) -> GemmaSpec:
    arch = pick_architecture(config, GEMMA_ARCHITECTURES)
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None) or "gelu_pytorch_tanh"
    if act not in _GELU_TANH:
        raise ValueError(f"{arch}: hidden_activation {act!r} is not supported (only gelu_pytorch_tanh)")
    if getattr(config, "use_bidirectional_attention", None):
        raise ValueError(f"{arch}: use_bidirectional_attention is not supported (causal decoding only)")
    rope = _per_layer_type_rope(config, arch) if arch == "Gemma3ForCausalLM" else None
    common = common_spec_fields(config, arch, check_activation=False, rope=rope and rope["full_attention"])
    head_dim = common["head_dim"]
    local_inv_freq, local_scaling = common["inv_freq"], common["rope_attention_scaling"]
    if rope is not None:  # the sliding layers' own rope (the global layers' is common's)
        local, local_scaling = rope_inv_freq(rope["sliding_attention"], head_dim)
        local_inv_freq = tuple(float(x) for x in local)
    attention_bias = bool(getattr(config, "attention_bias", False))
    scalar = getattr(config, "query_pre_attn_scalar", None) or head_dim
    attn_cap = getattr(config, "attn_logit_softcapping", None) if arch == "Gemma2ForCausalLM" else None
    final_cap = getattr(config, "final_logit_softcapping", None)
    return GemmaSpec(
        **common, intermediate_size=config.intermediate_size, qkv_bias=attention_bias, o_bias=attention_bias,
        mlp_bias=False, qk_norm=arch == "Gemma3ForCausalLM",
        embedding_multiplier=float(config.hidden_size) ** 0.5, attention_scale=float(scalar) ** -0.5,
        attention_soft_cap=float(attn_cap) if attn_cap else None,
        final_soft_cap=float(final_cap) if final_cap else None,
        local_inv_freq=local_inv_freq, local_rope_attention_scaling=float(local_scaling))


def _per_layer_type_rope(config: Any, arch: str) -> dict[str, dict]:
    """Gemma 3's `rope_parameters` {layer type: HF rope parameters} with rope_type filled in."""
    params = getattr(config, "rope_parameters", None) or {}
    out = {}
    for layer_type in ("full_attention", "sliding_attention"):
        rope = dict(params.get(layer_type) or {})
        if "rope_theta" not in rope:
            raise ValueError(f"{arch}: rope_parameters[{layer_type!r}] has no rope_theta")
        rope.setdefault("rope_type", rope.get("type", "default"))
        out[layer_type] = rope
    return out

"""Qwen3.5's spec: the decoder's fields, which layers are gated DeltaNet (recurrent) and which gated attention, and
the DeltaNet layers' shapes (docs/architecture/12-families.md, "Qwen3.5")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_jax.model.hybrid_decoder import HybridSpec, layer_kinds_of
from vllm_jax.model.spec import common_spec_fields, pick_architecture, rope_parameters_of
from vllm_jax.model.ssm.gated_deltanet import GatedDeltaNetSpec
from vllm_jax.model.state_cache import StateLayout

QWEN3_5_ARCHITECTURES = ("Qwen3_5ForCausalLM",)


@dataclass(frozen=True)
class Qwen3_5Spec(HybridSpec):
    """`layer_kinds`: the config's linear_attention layers (gated DeltaNet) are the recurrent ones."""

    deltanet: GatedDeltaNetSpec | None = field(default=None, kw_only=True)

    @property
    def state_layout(self) -> StateLayout:
        d = self.deltanet
        return StateLayout(len(self.recurrent_layers), (d.conv_kernel - 1, d.conv_dim),
                           (d.num_v_heads, d.head_k_dim, d.head_v_dim))


def qwen3_5_spec_from_hf_config(config: Any) -> Qwen3_5Spec:
    arch = pick_architecture(config, QWEN3_5_ARCHITECTURES)
    kinds = layer_kinds_of(arch, list(config.layer_types), {"full_attention"}, {"linear_attention"})
    rope = rope_parameters_of(config)
    rope.pop("mrope_section", None)  # text positions are equal on the three M-RoPE streams: plain rotary
    rope.pop("mrope_interleaved", None)
    common = common_spec_fields(config, arch, rope=rope)
    bias = bool(getattr(config, "attention_bias", False))
    return Qwen3_5Spec(**common, intermediate_size=config.intermediate_size, qkv_bias=bias, o_bias=bias,
                       mlp_bias=False, qk_norm=True, layer_kinds=kinds,
                       deltanet=GatedDeltaNetSpec.from_config(config))

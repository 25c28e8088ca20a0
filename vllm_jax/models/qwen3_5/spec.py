"""Qwen3.5's spec: the decoder's fields, which layers are gated DeltaNet and which gated attention, and the
DeltaNet layers' shapes (docs/architecture/12-families.md, "Qwen3.5")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_jax.model.spec import DecoderSpec, common_spec_fields, pick_architecture, rope_parameters_of
from vllm_jax.model.ssm.gated_deltanet import GatedDeltaNetSpec
from vllm_jax.model.state_cache import StateLayout

QWEN3_5_ARCHITECTURES = ("Qwen3_5ForCausalLM",)
LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class Qwen3_5Spec(DecoderSpec):
    layer_types: tuple[str, ...] = field(default=(), kw_only=True)  # per layer: LINEAR (DeltaNet) or FULL
    deltanet: GatedDeltaNetSpec | None = field(default=None, kw_only=True)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == LINEAR)

    @property
    def num_cache_layers(self) -> int:
        """Only the attention layers keep K/V in the paged cache."""
        return len(self.attention_layers)

    @property
    def state_layout(self) -> StateLayout:
        d = self.deltanet
        return StateLayout(len(self.linear_layers), (d.conv_kernel - 1, d.conv_dim),
                           (d.num_v_heads, d.head_k_dim, d.head_v_dim))


def qwen3_5_spec_from_hf_config(config: Any) -> Qwen3_5Spec:
    arch = pick_architecture(config, QWEN3_5_ARCHITECTURES)
    layer_types = tuple(config.layer_types)
    unknown = sorted(set(layer_types) - {LINEAR, FULL})
    if unknown:
        raise ValueError(f"{arch}: layer types {unknown} are not supported (only {LINEAR} and {FULL})")
    rope = rope_parameters_of(config)
    rope.pop("mrope_section", None)  # text positions are equal on the three M-RoPE streams: plain rotary
    rope.pop("mrope_interleaved", None)
    common = common_spec_fields(config, arch, rope=rope)
    bias = bool(getattr(config, "attention_bias", False))
    return Qwen3_5Spec(**common, intermediate_size=config.intermediate_size, qkv_bias=bias, o_bias=bias,
                       mlp_bias=False, qk_norm=True, layer_types=layer_types,
                       deltanet=GatedDeltaNetSpec.from_config(config))

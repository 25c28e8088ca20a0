"""Granite 4.0-H's spec (GraniteMoeHybridForCausalLM): the Granite multipliers, which layers are Mamba2 (recurrent)
and which attention, the Mamba2 shapes, rotary or none (docs/architecture/12-families.md, "Granite 4.0-H")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_jax.model.hybrid_decoder import HybridSpec, layer_kinds_of
from vllm_jax.model.spec import common_spec_fields, pick_architecture
from vllm_jax.model.ssm.mamba2 import Mamba2Spec
from vllm_jax.model.state_cache import StateLayout

GRANITE_HYBRID_ARCHITECTURES = ("GraniteMoeHybridForCausalLM",)


@dataclass(frozen=True)
class GraniteHybridSpec(HybridSpec):
    mamba: Mamba2Spec | None = field(default=None, kw_only=True)
    rotary: bool = field(default=False, kw_only=True)  # position_embedding_type "rope"; Granite 4.0-H's is none
    shared_intermediate_size: int = field(default=0, kw_only=True)

    @property
    def state_layout(self) -> StateLayout:
        m = self.mamba
        return StateLayout(len(self.recurrent_layers), m.conv_state_shape, m.ssm_state_shape)


def granite_hybrid_spec_from_hf_config(config: Any) -> GraniteHybridSpec:
    arch = pick_architecture(config, GRANITE_HYBRID_ARCHITECTURES)
    if int(getattr(config, "num_local_experts", 0) or 0) > 0:
        raise ValueError(f"{arch}: the MoE form (num_local_experts {config.num_local_experts}) is not built yet; "
                         "the dense form (num_local_experts 0) is")
    kinds = layer_kinds_of(arch, list(config.layer_types), {"full_attention", "attention"},
                           {"linear_attention", "mamba"})
    position = getattr(config, "position_embedding_type", None)
    if position not in (None, "nope", "rope"):
        raise ValueError(f"{arch}: position_embedding_type {position!r} is not supported (rope or none)")
    logits_scaling = float(getattr(config, "logits_scaling", 1.0))
    if logits_scaling == 0:
        raise ValueError(f"{arch}: logits_scaling must not be 0 (the logits are divided by it)")
    bias = bool(getattr(config, "attention_bias", False))
    common = common_spec_fields(config, arch)
    common["sliding_windows"] = (0,) * config.num_hidden_layers
    return GraniteHybridSpec(
        **common, intermediate_size=config.shared_intermediate_size, qkv_bias=bias, o_bias=bias, mlp_bias=False,
        qk_norm=False, embedding_multiplier=float(getattr(config, "embedding_multiplier", 1.0)),
        attention_scale=float(getattr(config, "attention_multiplier", 1.0)),
        residual_multiplier=float(getattr(config, "residual_multiplier", 1.0)), logits_scaling=logits_scaling,
        layer_kinds=kinds, mamba=Mamba2Spec.from_config(config), rotary=position == "rope",
        shared_intermediate_size=config.shared_intermediate_size)

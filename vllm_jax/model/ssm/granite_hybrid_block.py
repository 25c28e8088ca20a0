"""One Granite 4.0-H decoder layer of the Mamba kind (transformers' GraniteMoeHybridDecoderLayer with a Mamba2
mixer and the shared MLP): input RMSNorm, the Mamba2 mixer, the residual branch times `residual_multiplier`, post
RMSNorm, the shared SiLU-gated MLP, its branch times the multiplier too. A pure function over one layer's weights,
for the Granite 4.0-H family to call from its layer loop (docs/architecture/17-state-cache.md, "The step's
states"). The attention layers and the routed experts of the MoE forms are the family's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.model.layers import gated_mlp, rms_norm
from vllm_jax.model.ssm.mamba2 import Mamba2Spec, mamba2_mixer
from vllm_jax.model.ssm.mamba2_weights import mamba2_weights_from_hf


@dataclass(frozen=True)
class GraniteMambaBlockSpec:
    mamba: Mamba2Spec
    rms_norm_eps: float
    residual_multiplier: float
    shared_intermediate_size: int

    @classmethod
    def from_config(cls, config: Any) -> GraniteMambaBlockSpec:
        """From a transformers GraniteMoeHybridConfig."""
        return cls(mamba=Mamba2Spec.from_config(config), rms_norm_eps=config.rms_norm_eps,
                   residual_multiplier=float(config.residual_multiplier),
                   shared_intermediate_size=config.shared_intermediate_size)


def granite_mamba_block(spec: GraniteMambaBlockSpec, w: dict, hidden: jax.Array, conv_initial: jax.Array,
                        ssm_initial: jax.Array, query_start_loc: jax.Array,
                        num_seqs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """hidden [T, hidden] -> (hidden, conv_final, ssm_final). `w`: input_norm, post_attention_norm [hidden],
    mamba (the mixer's weights, model/ssm/mamba2.py), gate_proj / up_proj [hidden, shared_intermediate],
    down_proj [shared_intermediate, hidden]."""
    scale = jnp.asarray(spec.residual_multiplier, hidden.dtype)
    x = rms_norm(hidden, w["input_norm"], spec.rms_norm_eps)
    mixed, conv_final, ssm_final = mamba2_mixer(spec.mamba, w["mamba"], x, conv_initial, ssm_initial,
                                                query_start_loc, num_seqs)
    hidden = hidden + mixed * scale
    hidden = hidden + gated_mlp(w, rms_norm(hidden, w["post_attention_norm"], spec.rms_norm_eps)) * scale
    return hidden, conv_final, ssm_final


def granite_mamba_block_weights_from_hf(spec: GraniteMambaBlockSpec, tensors: Mapping[str, np.ndarray],
                                        prefix: str) -> dict:
    """One layer's `w` from HF tensors by full name (`prefix`: `model.layers.{i}.`). The shared MLP's
    input_linear [2 * shared_intermediate, hidden] holds the gate rows, then the up rows."""
    fused = np.asarray(tensors[prefix + "shared_mlp.input_linear.weight"])
    size = spec.shared_intermediate_size
    return {
        "input_norm": np.asarray(tensors[prefix + "input_layernorm.weight"]),
        "post_attention_norm": np.asarray(tensors[prefix + "post_attention_layernorm.weight"]),
        "mamba": mamba2_weights_from_hf(spec.mamba, tensors, prefix + "mamba."),
        "gate_proj": fused[:size].T,
        "up_proj": fused[size:].T,
        "down_proj": np.asarray(tensors[prefix + "shared_mlp.output_linear.weight"]).T,
    }

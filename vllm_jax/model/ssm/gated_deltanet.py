"""Gated DeltaNet, the recurrent mixer of Qwen3.5 and Qwen3-Next, as one pure function of one layer's weights over a
step's ragged batch: input projections, the causal conv with SiLU over q/k/v, the gated delta rule, a gated RMSNorm
and the output projection (docs/architecture/17-state-cache.md, "Gated DeltaNet"). Qwen3-Next's fused input
projections are split into Qwen3.5's four at load time (gated_deltanet_weights.py), so one mixer serves both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from vllm_jax.model.layers import linear, linears
from vllm_jax.model.ssm.causal_conv import causal_conv1d
from vllm_jax.model.ssm.gated_delta import gated_delta_rule

INPUT_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")


@dataclass(frozen=True)
class GatedDeltaNetSpec:
    """The shapes of one gated DeltaNet layer (the same for every such layer of a model)."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    rms_norm_eps: float

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """The conv's channels: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim

    @classmethod
    def from_config(cls, config: Any) -> GatedDeltaNetSpec:
        """From a Qwen3.5 text config or a Qwen3-Next config (the same `linear_*` fields)."""
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"gated DeltaNet: conv activation {config.hidden_act!r} is not supported (silu only)")
        spec = cls(num_k_heads=config.linear_num_key_heads, num_v_heads=config.linear_num_value_heads,
                   head_k_dim=config.linear_key_head_dim, head_v_dim=config.linear_value_head_dim,
                   conv_kernel=config.linear_conv_kernel_dim, rms_norm_eps=config.rms_norm_eps)
        if spec.num_v_heads % spec.num_k_heads:
            raise ValueError(f"gated DeltaNet: {spec.num_v_heads} value heads do not share "
                             f"{spec.num_k_heads} key heads evenly")
        return spec


def gated_deltanet(spec: GatedDeltaNetSpec, w: dict, x: jax.Array, conv_initial: jax.Array,
                   rec_initial: jax.Array, query_start_loc: jax.Array,
                   num_seqs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x [T, hidden] -> (out [T, hidden], conv_final [S, K-1, conv_dim], rec_final [S, Hv, dk, dv] float32), each
    sequence continuing from its conv state `conv_initial` [S, K-1, conv_dim] and recurrent state `rec_initial`.

    `w`: in_proj_qkv [hidden, conv_dim], in_proj_z [hidden, value_dim], in_proj_b / in_proj_a [hidden, Hv],
    conv1d [conv_dim, K], dt_bias / A_log [Hv], norm [dv], out_proj [value_dim, hidden]; linear weights in any
    weight form `layers.linear` takes."""
    num_tokens = x.shape[0]
    qkv, z, b, a = linears(x, [w[name] for name in INPUT_PROJECTIONS], [None] * len(INPUT_PROJECTIONS))
    mixed, conv_final = causal_conv1d(qkv, w["conv1d"], None, conv_initial, query_start_loc, num_seqs)
    q, k, v = jnp.split(mixed, [spec.key_dim, 2 * spec.key_dim], axis=-1)
    beta = jax.nn.sigmoid(b)
    g = -jnp.exp(w["A_log"].astype(jnp.float32)) * jax.nn.softplus(
        a.astype(jnp.float32) + w["dt_bias"].astype(jnp.float32))
    core, rec_final = gated_delta_rule(
        q.reshape(num_tokens, spec.num_k_heads, spec.head_k_dim),
        k.reshape(num_tokens, spec.num_k_heads, spec.head_k_dim),
        v.reshape(num_tokens, spec.num_v_heads, spec.head_v_dim),
        g, beta, rec_initial, query_start_loc, num_seqs)
    gate = z.reshape(num_tokens, spec.num_v_heads, spec.head_v_dim)
    normed = gated_rms_norm(core, gate, w["norm"], spec.rms_norm_eps)
    return linear(normed.reshape(num_tokens, spec.value_dim), w["out_proj"]), conv_final, rec_final


def gated_rms_norm(x: jax.Array, gate: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis (normalised in float32, back in x's dtype, times `weight`), then times
    silu(gate) in float32: transformers' Qwen3_5RMSNormGated (Qwen3-Next's is the same)."""
    xf = x.astype(jnp.float32)
    normed = (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype)
    scaled = (weight * normed).astype(jnp.float32)
    return (scaled * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)

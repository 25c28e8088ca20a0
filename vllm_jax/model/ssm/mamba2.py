"""The Mamba2 mixer as Granite 4.0-H defines it (transformers' GraniteMoeHybridMambaLayer): in_proj into the gate, the
conv's x / B / C and dt; the causal conv with SiLU; the SSD scan with groups, the D skip, dt's bias, softplus and
limits; the gated RMSNorm per group; out_proj. One pure function over one layer's weights and a step's ragged
batch, each sequence continuing from its conv and SSM states (docs/architecture/17-state-cache.md, "Mamba2
(Granite 4.0-H)")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from vllm_jax.model.layers import linear
from vllm_jax.model.ssm.causal_conv import causal_conv1d
from vllm_jax.model.ssm.mamba2_ssd import ssd

# The SSD's result does not depend on the chunk size (up to rounding); the cost does: each chunk's within-chunk part
# is quadratic in it, and a ragged step gives every sequence row its own chunks (a decode row in a mixed step takes
# a whole chunk), so the chunk is capped below Granite's 256.
MAX_CHUNK_SIZE = 64


@dataclass(frozen=True)
class Mamba2Spec:
    """One Mamba2 layer's shape and constants (the same for every Mamba2 layer of a model)."""

    hidden_size: int
    num_heads: int
    head_dim: int
    n_groups: int
    d_state: int
    conv_kernel: int
    intermediate_size: int  # num_heads * head_dim
    chunk_size: int  # the SSD's chunk: the config's, at most MAX_CHUNK_SIZE
    time_step_limit: tuple[float, float]
    rms_norm_eps: float
    use_conv_bias: bool
    use_proj_bias: bool

    @classmethod
    def from_config(cls, config: Any) -> Mamba2Spec:
        """From a transformers GraniteMoeHybridConfig (its `mamba_*` fields; `mamba_d_head` "auto" is resolved
        by the config itself to intermediate // heads; the chunk capped at MAX_CHUNK_SIZE)."""
        intermediate = int(config.mamba_expand * config.hidden_size)
        heads = config.mamba_n_heads
        head_dim = config.mamba_d_head
        if head_dim == "auto" or head_dim is None:
            head_dim = intermediate // heads
        limit = config.time_step_limit
        return cls(hidden_size=config.hidden_size, num_heads=heads, head_dim=int(head_dim),
                   n_groups=config.mamba_n_groups, d_state=config.mamba_d_state, conv_kernel=config.mamba_d_conv,
                   intermediate_size=intermediate,
                   chunk_size=min(config.mamba_chunk_size, MAX_CHUNK_SIZE),
                   time_step_limit=(0.0, math.inf) if limit is None else (float(limit[0]), float(limit[1])),
                   rms_norm_eps=config.rms_norm_eps, use_conv_bias=bool(config.mamba_conv_bias),
                   use_proj_bias=bool(config.mamba_proj_bias))

    def __post_init__(self):
        if self.num_heads * self.head_dim != self.intermediate_size:
            raise ValueError(f"Mamba2: {self.num_heads} heads x {self.head_dim} != {self.intermediate_size}")
        if self.num_heads % self.n_groups or self.intermediate_size % self.n_groups:
            raise ValueError(f"Mamba2: {self.n_groups} groups do not divide {self.num_heads} heads")

    @property
    def conv_dim(self) -> int:
        """The conv's channels: x, then B, then C."""
        return self.intermediate_size + 2 * self.n_groups * self.d_state

    @property
    def in_proj_size(self) -> int:
        """in_proj's outputs: the gate, the conv's channels, dt."""
        return self.intermediate_size + self.conv_dim + self.num_heads

    @property
    def norm_group_size(self) -> int:
        return self.intermediate_size // self.n_groups

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        """One sequence's conv state: its last K-1 conv inputs."""
        return (self.conv_kernel - 1, self.conv_dim)

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        """One sequence's SSM state (float32)."""
        return (self.num_heads, self.head_dim, self.d_state)


def mamba2_mixer(spec: Mamba2Spec, w: dict, x: jax.Array, conv_initial: jax.Array, ssm_initial: jax.Array,
                 query_start_loc: jax.Array, num_seqs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x [T, hidden] -> (out [T, hidden], conv_final [S, K-1, conv_dim], ssm_final [S, H, P, N] float32).
    `w`: in_proj [hidden, in_proj_size] (+ in_proj_bias), conv1d [conv_dim, K] (+ conv1d_bias), dt_bias / A_log /
    D [H], norm [intermediate], out_proj [intermediate, hidden] (+ out_proj_bias)."""
    num_tokens = x.shape[0]
    heads, groups, n = spec.num_heads, spec.n_groups, spec.d_state
    projected = linear(x, w["in_proj"], w.get("in_proj_bias"))
    gate, conv_in, dt = jnp.split(projected, [spec.intermediate_size, spec.intermediate_size + spec.conv_dim],
                                  axis=-1)
    conv_out, conv_final = causal_conv1d(conv_in, w["conv1d"], w.get("conv1d_bias"), conv_initial,
                                         query_start_loc, num_seqs, activation="silu")
    xs, B, C = jnp.split(conv_out, [spec.intermediate_size, spec.intermediate_size + groups * n], axis=-1)
    dt = jax.nn.softplus(dt.astype(jnp.float32) + w["dt_bias"].astype(jnp.float32))
    dt = jnp.clip(dt, spec.time_step_limit[0], spec.time_step_limit[1])
    A = -jnp.exp(w["A_log"].astype(jnp.float32))
    y, ssm_final = ssd(xs.reshape(num_tokens, heads, spec.head_dim), dt, A, B.reshape(num_tokens, groups, n),
                       C.reshape(num_tokens, groups, n), w["D"], ssm_initial, query_start_loc, num_seqs,
                       chunk_size=spec.chunk_size)
    y = gated_rms_norm(y.reshape(num_tokens, spec.intermediate_size), gate, w["norm"], spec.norm_group_size,
                       spec.rms_norm_eps)
    return linear(y.astype(x.dtype), w["out_proj"], w.get("out_proj_bias")), conv_final, ssm_final


def gated_rms_norm(y: jax.Array, gate: jax.Array, weight: jax.Array, group_size: int, eps: float) -> jax.Array:
    """GraniteMoeHybridRMSNormGated: y * silu(gate) first, then RMS-normalised over each group of `group_size`
    channels (float32), cast back to y's dtype and scaled by `weight`."""
    gated = y.astype(jnp.float32) * jax.nn.silu(gate.astype(jnp.float32))
    grouped = gated.reshape(*gated.shape[:-1], -1, group_size)
    grouped = grouped * jax.lax.rsqrt(jnp.mean(grouped * grouped, axis=-1, keepdims=True) + eps)
    return weight * grouped.reshape(gated.shape).astype(y.dtype)

"""gpt-oss's routed experts: the biased router, the clamped SwiGLU and the grouped expert FFN with biases.

Routing (transformers' GptOssTopKRouter): logits = x @ router + bias in the model dtype -> top-k of the logits
-> softmax over those k (in the model dtype). Experts (GptOssExperts): gate_up = x @ W_gu[e] + b_gu[e], gate and up
interleaved on its columns (gate = [..., 0::2], up = [..., 1::2]); gate clamped above at `limit`, up to
[-limit, limit]; h = (up + 1) * gate * sigmoid(alpha * gate); out = h @ W_d[e] + b_d[e]. The assignments run
through moe.ExpertGroups (sorted by expert, `ragged_dot` per group) like Mixtral's experts, so expert
parallelism is the same scheme: each device runs its slab of experts, one psum combines.

Params of one layer: router [H, E], router_bias [E], experts_gate_up [E, H, 2I], experts_gate_up_bias [E, 2I],
experts_down [E, I, H], experts_down_bias [E, H] (the fused layout the checkpoint stores, columns interleaved).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from vllm_jax.model.moe import ExpertGroups

EXPERT_NAMES = ("experts_gate_up", "experts_gate_up_bias", "experts_down", "experts_down_bias")


def route_top_logits(x: jax.Array, router: jax.Array, bias: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """-> (float32 weights [T, k], int32 expert ids [T, k]): softmax over the top-k router logits, rounded to the
    model dtype as transformers computes it there."""
    logits = (jnp.dot(x, router, preferred_element_type=jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)
    top, ids = jax.lax.top_k(logits, top_k)
    weights = jax.nn.softmax(top.astype(jnp.float32), axis=-1).astype(x.dtype).astype(jnp.float32)
    return weights, ids.astype(jnp.int32)


def clamped_swiglu(gate_up: jax.Array, alpha: float, limit: float) -> jax.Array:
    """[..., 2I] interleaved (gate, up) pairs -> [..., I]: (clip(up) + 1) * g * sigmoid(alpha * g), g = min(gate,
    limit). The pairs are split by a reshape, which keeps a column-split (tensor-parallel) axis local."""
    pairs = gate_up.reshape(*gate_up.shape[:-1], gate_up.shape[-1] // 2, 2)
    gate = jnp.minimum(pairs[..., 0], limit)
    up = jnp.clip(pairs[..., 1], -limit, limit)
    return (up + 1) * (gate * jax.nn.sigmoid(gate * alpha))


def expert_ffn(x: jax.Array, weights: jax.Array, expert_ids: jax.Array, gate_up: jax.Array, gate_up_bias: jax.Array,
               down: jax.Array, down_bias: jax.Array, *, alpha: float, limit: float,
               expert_offset: jax.Array | int = 0) -> jax.Array:
    """sum_k weights[t, k] * FFN_{expert_ids[t, k]}(x[t]) over the experts held here (global experts
    expert_offset .. + E_here - 1; others add 0) -> float32 [T, H]. Matmuls accumulate in float32, the biases
    join there, and each result is rounded to x's dtype as transformers' Linear-with-bias does."""
    groups = ExpertGroups.of(expert_ids, gate_up.shape[0], expert_offset)
    xs = x[groups.order // expert_ids.shape[1]]
    h = jax.lax.ragged_dot(xs, gate_up, groups.sizes, preferred_element_type=jnp.float32)
    h = (h + gate_up_bias[groups.row_expert].astype(jnp.float32)).astype(x.dtype)
    h = clamped_swiglu(h, alpha, limit)
    out = jax.lax.ragged_dot(h, down, groups.sizes, preferred_element_type=jnp.float32)
    out = (out + down_bias[groups.row_expert].astype(jnp.float32)).astype(x.dtype)
    return groups.combine(out, weights)


def expert_parallel_ffn(mesh: Mesh, axis: str, x: jax.Array, weights: jax.Array, expert_ids: jax.Array,
                        experts: tuple[jax.Array, ...], *, alpha: float, limit: float) -> jax.Array:
    """`expert_ffn` with the expert axis of the four expert params split over `mesh` axis `axis`: tokens and
    routing replicated, each device runs its experts, a psum combines (as moe.expert_parallel_ffn)."""

    def local(x, weights, expert_ids, *experts):
        offset = jax.lax.axis_index(axis) * experts[0].shape[0]
        out = expert_ffn(x, weights, expert_ids, *experts, alpha=alpha, limit=limit, expert_offset=offset)
        return jax.lax.psum(out, axis)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P()) + (P(axis),) * len(experts),
                         out_specs=P())(x, weights, expert_ids, *experts)

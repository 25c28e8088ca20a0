"""gpt-oss's routed experts: the biased router, the clamped SwiGLU and the grouped expert FFN with biases.

Routing (transformers' GptOssTopKRouter): logits = x @ router + bias in the model dtype -> top-k of the logits
-> softmax over those k (in the model dtype). Experts (GptOssExperts): gate_up = x @ W_gu[e] + b_gu[e], gate and up
interleaved on its columns (gate = [..., 0::2], up = [..., 1::2]); gate clamped above at `limit`, up to
[-limit, limit]; h = (up + 1) * gate * sigmoid(alpha * gate); out = h @ W_d[e] + b_d[e]. The assignments run
through model/weight_forms/experts.py's ExpertGroups and expert stacks (sorted by expert, `ragged_dot` per group)
like Mixtral's experts, so expert parallelism is the same scheme: each device runs its slab of experts, one psum
combines.

Params of one layer: router [H, E], router_bias [E], experts_gate_up [E, H, 2I], experts_gate_up_bias [E, 2I],
experts_down [E, I, H], experts_down_bias [E, H] (the fused layout the checkpoint stores, columns interleaved).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from vllm_jax.model.weight_forms.experts import ExpertGroups, ExpertStack, as_expert_stack

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


def expert_ffn(x: jax.Array, weights: jax.Array, expert_ids: jax.Array, gate_up: ExpertStack | jax.Array,
               gate_up_bias: jax.Array, down: ExpertStack | jax.Array, down_bias: jax.Array, *, alpha: float,
               limit: float, expert_offset: jax.Array | int = 0) -> jax.Array:
    """sum_k weights[t, k] * FFN_{expert_ids[t, k]}(x[t]) over the experts held here (global experts
    expert_offset .. + E_here - 1; others add 0) -> float32 [T, H]. `gate_up` / `down`: expert stacks (model/
    weight_forms/experts.py; a plain array is a plain stack). Matmuls accumulate in float32, the biases join
    there, and each result is rounded to x's dtype as transformers' Linear-with-bias does."""
    gate_up, down = as_expert_stack(gate_up), as_expert_stack(down)
    groups = ExpertGroups.of(expert_ids, gate_up.num_experts, expert_offset)
    h = clamped_swiglu(gate_up.grouped_linear(x[groups.row_token], groups, gate_up_bias), alpha, limit)
    return groups.combine(down.grouped_linear(h, groups, down_bias), weights)


def expert_parallel_ffn(mesh: Mesh, axis: str, x: jax.Array, weights: jax.Array, expert_ids: jax.Array,
                        experts: tuple[ExpertStack | jax.Array, jax.Array, ExpertStack | jax.Array, jax.Array], *,
                        alpha: float, limit: float) -> jax.Array:
    """`expert_ffn` with the expert axis of (gate_up, its bias, down, its bias) split over `mesh` axis `axis`:
    tokens and routing replicated, each device runs its experts, a psum combines (as moe.expert_parallel_ffn)."""
    gate_up, gate_up_bias, down, down_bias = experts
    experts = (as_expert_stack(gate_up), gate_up_bias, as_expert_stack(down), down_bias)

    def local(x, weights, expert_ids, experts):
        offset = jax.lax.axis_index(axis) * experts[0].num_experts
        out = expert_ffn(x, weights, expert_ids, *experts, alpha=alpha, limit=limit, expert_offset=offset)
        return jax.lax.psum(out, axis)

    specs = (experts[0].expert_axis_specs(axis), P(axis), experts[2].expert_axis_specs(axis), P(axis))
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), specs), out_specs=P())(x, weights, expert_ids,
                                                                                          experts)

"""DeepSeek's expert routing (V3 sigmoid + correction bias with group-limited top-k; V2 softmax, greedy or
group-limited greedy), in transformers' order of operations, all in float32 (models/deepseek/spec.py has the rules)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vllm_jax.models.deepseek.spec import MlaSpec

_NEG_INF = -jnp.inf


def _group_mask(group_scores: jax.Array, topk_group: int, num_experts: int) -> jax.Array:
    """[T, E] bool: the experts of each token's `topk_group` best groups (group_scores [T, G])."""
    t, groups = group_scores.shape
    _, best = jax.lax.top_k(group_scores, topk_group)
    keep = jnp.zeros((t, groups), bool).at[jnp.arange(t)[:, None], best].set(True)
    return jnp.repeat(keep, num_experts // groups, axis=1)


def deepseek_route(spec: MlaSpec, x: jax.Array, router: jax.Array,
                   bias: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """-> (float32 weights [T, k], int32 expert ids [T, k]) for hidden states x [T, H]; router [H, E]; bias [E]
    (V3's e_score_correction_bias, None for V2)."""
    logits = jnp.dot(x.astype(jnp.float32), router.astype(jnp.float32), preferred_element_type=jnp.float32)
    t, e = logits.shape
    k, groups = spec.num_experts_per_tok, spec.n_group
    if spec.topk_method == "noaux_tc":
        scores = jax.nn.sigmoid(logits)
        choice = scores + bias.astype(jnp.float32)
        if groups > 1:
            top2, _ = jax.lax.top_k(choice.reshape(t, groups, e // groups), 2)
            mask = _group_mask(top2.sum(-1), spec.topk_group, e)
            choice = jnp.where(mask, choice, _NEG_INF)
        _, ids = jax.lax.top_k(choice, k)
        weights = jnp.take_along_axis(scores, ids, axis=-1)
        if spec.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    else:
        scores = jax.nn.softmax(logits, axis=-1)
        if spec.topk_method == "group_limited_greedy" and groups > 1:
            mask = _group_mask(scores.reshape(t, groups, e // groups).max(-1), spec.topk_group, e)
            scores = jnp.where(mask, scores, 0.0)
        weights, ids = jax.lax.top_k(scores, k)
        if spec.norm_topk_prob and k > 1:
            weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    return weights * spec.routed_scaling_factor, ids.astype(jnp.int32)

"""A MoE expert stack with LoRA adapters: one projection's adapter slots of the experts held here
(`ExpertAdapter`) and the form that adds their delta to its base stack's rows (`LoRAExperts`)
(docs/architecture/11-lora.md, "Mixture-of-experts models")."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from vllm_jax.model.weight_forms.experts import ExpertGroups, ExpertStack
from vllm_jax.model.weight_forms.lora import LoRAMask


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ExpertAdapter:
    """One projection's slots a [N, E_here, in, R] and b [N, E_here, R, out] of the experts held here (slot 0
    zeros, scaling folded into b), each token's slot one-hot [T, N - 1] and whether any token has an adapter.

    `delta` is the experts' form of LoRAAdapter's masked product: the grouped rows (each a (token, expert) pair,
    sorted by expert) meet every slot's A of their own expert in one ragged dot of (N - 1) * R columns, the
    token's one-hot keeps its slot, and a second ragged dot meets B. Skipped (a cond) when no token has one."""

    a: jax.Array
    b: jax.Array
    one_hot: jax.Array
    active: jax.Array

    def delta(self, rows: jax.Array, groups: ExpertGroups) -> jax.Array:
        """[rows, out] float32: B(A(x)) of each grouped row under its token's slot."""
        a, b = self.a, self.b

        def product(rows: jax.Array) -> jax.Array:
            n, e, fin, r = a.shape[0] - 1, a.shape[1], a.shape[2], a.shape[3]
            a_cols = jnp.transpose(a[1:], (1, 2, 0, 3)).reshape(e, fin, n * r).astype(rows.dtype)
            xa = jax.lax.ragged_dot(rows, a_cols, groups.sizes, preferred_element_type=jnp.float32)
            xa = (xa.reshape(-1, n, r) * self.one_hot[groups.row_token][:, :, None]).reshape(-1, n * r)
            b_rows = jnp.transpose(b[1:], (1, 0, 2, 3)).reshape(e, n * r, b.shape[-1])
            return jax.lax.ragged_dot(xa.astype(b.dtype), b_rows, groups.sizes, preferred_element_type=jnp.float32)

        # inside expert parallelism's shard_map the product varies over the expert axis: so must the zeros
        operands = (rows, a, b, groups.sizes, groups.row_token, self.one_hot)
        varying = tuple(frozenset().union(*(jax.typeof(v).manual_axis_type.varying for v in operands)))

        def nothing(rows: jax.Array) -> jax.Array:
            zeros = jnp.zeros((rows.shape[0], b.shape[-1]), jnp.float32)
            return jax.lax.pcast(zeros, varying, to="varying") if varying else zeros

        return jax.lax.cond(self.active, product, nothing, rows)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LoRAExperts(ExpertStack):
    """A base expert stack (any form) plus its adapters: the base's rows (bias added, cast to the rows' dtype)
    with each row's delta added in float32."""

    base: ExpertStack
    adapter: ExpertAdapter

    @classmethod
    def of(cls, base: ExpertStack, a: jax.Array, b: jax.Array, layer: jax.Array | int,
           mask: LoRAMask) -> LoRAExperts:
        """`base` with layer `layer`'s slice of the stacked slots a [L, N, E, in, R] / b [L, N, E, R, out]."""
        return cls(base, ExpertAdapter(a[layer], b[layer], mask.one_hot, mask.active))

    @property
    def num_experts(self) -> int:
        return self.base.num_experts

    def grouped_matmul(self, rows: jax.Array, groups: ExpertGroups) -> jax.Array:
        return self.base.grouped_matmul(rows, groups) + self.adapter.delta(rows, groups)

    def grouped_linear(self, rows: jax.Array, groups: ExpertGroups, bias: jax.Array | None = None) -> jax.Array:
        y = self.base.grouped_linear(rows, groups, bias)
        return (y.astype(jnp.float32) + self.adapter.delta(rows, groups)).astype(rows.dtype)

    def expert_axis_specs(self, axis: str) -> LoRAExperts:
        return LoRAExperts(self.base.expert_axis_specs(axis), ExpertAdapter(P(None, axis), P(None, axis), P(), P()))

"""LoRA inside the forward: `bundle_lora` wrapping one layer's targets in the LoRA weight form
(model/weight_forms/lora.py: `LoRAWeight`, a base weight plus its `LoRAAdapter`, whose delta its `linear` adds),
and the MoE experts' adapters (`ExpertLoRA`) (docs/architecture/11-lora.md, "LoRA adapters")."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from vllm_jax.model.fused_projections import QKV, QKV_PARTS
from vllm_jax.model.weight_forms.dense import as_weight_form
from vllm_jax.model.weight_forms.lora import LoRAAdapter, LoRAMask, LoRAWeight


def bundle_lora(w: dict, lora: dict | None, mask: LoRAMask | None, layer: jax.Array | int) -> dict:
    """Layer `layer`'s weights with each adapted linear wrapped in a LoRAWeight (unchanged without `lora`).
    `lora`: target name -> (a [L, N, in, R], b [L, N, R, out]), every layer's slots. A target inside a fused
    weight (q_proj in `qkv_proj`: model/fused_projections.py) gets its LoRAAdapter alone under its own name,
    whose delta `layers.fused_linears` adds to that part's output."""
    if not lora:
        return w
    out = dict(w)
    for name, (a, b) in lora.items():
        if name in out:  # a MoE layer's attention half, or its experts' (ExpertLoRA)
            out[name] = LoRAWeight(as_weight_form(out[name]), LoRAAdapter(a, b, mask, layer))
        elif name in QKV_PARTS and QKV in out:
            out[name] = LoRAAdapter(a, b, mask, layer)
    return out


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ExpertLoRA:
    """One MoE layer's expert adapters: per projection (gate, up, down) the slots a [N, E_here, in, R] and
    b [N, E_here, R, out] of the experts held here, each token's slot one-hot [T, N - 1] and whether any token has
    an adapter (docs/architecture/11-lora.md, "Mixture-of-experts models").

    `delta` is the experts' form of LoRAAdapter's masked product: the grouped rows (each a (token, expert) pair,
    sorted by expert) meet every slot's A of their own expert in one ragged dot of (N - 1) * R columns, the
    token's one-hot keeps its slot, and a second ragged dot meets B. Skipped (a cond) when no token has one."""

    a: tuple[jax.Array, jax.Array, jax.Array]
    b: tuple[jax.Array, jax.Array, jax.Array]
    one_hot: jax.Array
    active: jax.Array

    @classmethod
    def of(cls, lora: dict, mask: LoRAMask, layer: jax.Array | int,
           names: tuple[str, str, str]) -> ExpertLoRA:
        """Layer `layer`'s slice of the stacked expert slots ([L, N, E, ...] each) named `names`."""
        return cls(tuple(lora[n][0][layer] for n in names), tuple(lora[n][1][layer] for n in names),
                   mask.one_hot, mask.active)

    def delta(self, which: int, xs: jax.Array, group_sizes: jax.Array, row_token: jax.Array) -> jax.Array:
        """[rows, out] float32: projection `which`'s B(A(x)) of each grouped row under its token's slot."""
        a, b = self.a[which], self.b[which]

        def product(xs: jax.Array) -> jax.Array:
            n, e, fin, r = a.shape[0] - 1, a.shape[1], a.shape[2], a.shape[3]
            a_cols = jnp.transpose(a[1:], (1, 2, 0, 3)).reshape(e, fin, n * r).astype(xs.dtype)
            xa = jax.lax.ragged_dot(xs, a_cols, group_sizes, preferred_element_type=jnp.float32)
            xa = (xa.reshape(-1, n, r) * self.one_hot[row_token][:, :, None]).reshape(-1, n * r)
            b_rows = jnp.transpose(b[1:], (1, 0, 2, 3)).reshape(e, n * r, b.shape[-1])
            return jax.lax.ragged_dot(xa.astype(b.dtype), b_rows, group_sizes, preferred_element_type=jnp.float32)

        # inside expert parallelism's shard_map the product varies over the expert axis: so must the zeros
        varying = tuple(frozenset().union(*(jax.typeof(v).manual_axis_type.varying
                                            for v in (xs, a, b, group_sizes, row_token, self.one_hot))))

        def nothing(xs: jax.Array) -> jax.Array:
            zeros = jnp.zeros((xs.shape[0], b.shape[-1]), jnp.float32)
            return jax.lax.pcast(zeros, varying, to="varying") if varying else zeros

        return jax.lax.cond(self.active, product, nothing, xs)

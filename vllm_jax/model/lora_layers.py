"""LoRA inside the forward: each token's adapter slot (`LoRAMask`), a base linear weight wrapped with every layer's
adapter stacks (`LoRAWeight`, whose delta `layers.linear` adds), and `bundle_lora` wrapping one layer's targets
(docs/architecture/11-lora.md, "LoRA adapters")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from vllm_jax.model.fused_projections import QKV, QKV_PARTS


@dataclass(frozen=True)
class LoRAMask:
    """Which adapter slot each token of the step reads: one-hot over slots 1..N-1, [T, N - 1] float32 (a token of
    slot 0, no adapter, has an all-zero row), and whether any token has an adapter at all (a scalar bool)."""

    one_hot: jax.Array
    active: jax.Array

    @classmethod
    def of(cls, lora_slots: jax.Array, num_slots: int) -> LoRAMask:
        return cls(jax.nn.one_hot(lora_slots - 1, num_slots - 1, dtype=jnp.float32), jnp.any(lora_slots > 0))


@dataclass(frozen=True)
class LoRAWeight:
    """A base linear weight plus the adapter slots of every layer: a [L, N, in, R], b [L, N, R, out] (N = max_loras
    + 1, slot 0 zeros, scaling folded into b), this layer's index and the step's LoRAMask. (With `layer` None, a
    and b are one layer's [N, in, R] / [N, R, out].)

    The delta is computed for all adapter slots at once and masked per token: (x @ a[1:]) is [T, N - 1, R], the mask
    keeps each token's own slot, and the [T, (N - 1) * R] result meets b[1:] as one [(N - 1) * R, out] matrix. Two
    dense dots of (N - 1) * R columns, no [T, in, R] gather of per-token adapters; slot 0 is left out (it is
    zeros). A step in which no token has an adapter skips it all (a cond), the layer's slice of the stacks
    included (it is taken inside the branch, not by the layer scan), so base-only batches cost nothing extra
    (docs/architecture/11-lora.md, "LoRA adapters")."""

    base: Any  # jax.Array | layers.LayerSwitch | layers.QuantizedWeight
    a: jax.Array
    b: jax.Array
    mask: LoRAMask
    layer: jax.Array | int | None = None

    def delta(self, x: jax.Array) -> jax.Array:
        """[T, out] float32: each token's B(A(x)) under its own slot."""
        def product(x: jax.Array) -> jax.Array:
            a, b = (self.a, self.b) if self.layer is None else (self.a[self.layer], self.b[self.layer])
            xa = jnp.einsum("ti,nir->tnr", x, a[1:].astype(x.dtype), preferred_element_type=jnp.float32)
            xa = (xa * self.mask.one_hot[:, :, None]).astype(b.dtype)
            return jnp.einsum("tnr,nro->to", xa, b[1:], preferred_element_type=jnp.float32)

        def nothing(x: jax.Array) -> jax.Array:
            return jnp.zeros((x.shape[0], self.b.shape[-1]), jnp.float32)

        return jax.lax.cond(self.mask.active, product, nothing, x)


def bundle_lora(w: dict, lora: dict | None, mask: LoRAMask | None, layer: jax.Array | int) -> dict:
    """Layer `layer`'s weights with each adapted linear wrapped in a LoRAWeight (unchanged without `lora`).
    `lora`: target name -> (a [L, N, in, R], b [L, N, R, out]), every layer's slots. A target inside a fused
    weight (q_proj in `qkv_proj`: model/fused_projections.py) gets a LoRAWeight without a base under its own name,
    whose delta `layers.fused_linears` adds to that part's output."""
    if not lora:
        return w
    out = dict(w)
    for name, (a, b) in lora.items():
        if name in out:  # a MoE layer's attention half, or its experts' (ExpertLoRA)
            out[name] = LoRAWeight(out[name], a, b, mask, layer)
        elif name in QKV_PARTS and QKV in out:
            out[name] = LoRAWeight(None, a, b, mask, layer)
    return out


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ExpertLoRA:
    """One MoE layer's expert adapters: per projection (gate, up, down) the slots a [N, E_here, in, R] and
    b [N, E_here, R, out] of the experts held here, each token's slot one-hot [T, N - 1] and whether any token has
    an adapter (docs/architecture/11-lora.md, "Mixture-of-experts models").

    `delta` is the experts' form of LoRAWeight's masked product: the grouped rows (each a (token, expert) pair,
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

"""A base weight with LoRA adapters: each token's slot (`LoRAMask`), a linear's adapter slots (`LoRAAdapter`) and
the form that adds their delta to its base's product (`LoRAWeight`); model/lora_layers.py wraps a layer's targets
(docs/architecture/11-lora.md, "LoRA adapters")."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from vllm_jax.model.weight_forms.base import WeightForm


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LoRAMask:
    """Which adapter slot each token of the step reads: one-hot over slots 1..N-1, [T, N - 1] float32 (a token of
    slot 0, no adapter, has an all-zero row), and whether any token has an adapter at all (a scalar bool)."""

    one_hot: jax.Array
    active: jax.Array

    @classmethod
    def of(cls, lora_slots: jax.Array, num_slots: int) -> LoRAMask:
        return cls(jax.nn.one_hot(lora_slots - 1, num_slots - 1, dtype=jnp.float32), jnp.any(lora_slots > 0))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LoRAAdapter:
    """One linear's adapter slots of every layer: a [L, N, in, R], b [L, N, R, out] (N = max_loras + 1, slot 0
    zeros, scaling folded into b), this layer's index and the step's LoRAMask. (With `layer` None, a and b are one
    layer's [N, in, R] / [N, R, out].)

    The delta is computed for all adapter slots at once and masked per token: (x @ a[1:]) is [T, N - 1, R], the mask
    keeps each token's own slot, and the [T, (N - 1) * R] result meets b[1:] as one [(N - 1) * R, out] matrix. Two
    dense dots of (N - 1) * R columns, no [T, in, R] gather of per-token adapters; slot 0 is left out (it is
    zeros). A step in which no token has an adapter skips it all (a cond), the layer's slice of the stacks
    included (it is taken inside the branch, not by the layer scan), so base-only batches cost nothing extra
    (docs/architecture/11-lora.md, "LoRA adapters")."""

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

    def added_to(self, x: jax.Array, y: jax.Array) -> jax.Array:
        """The base output `y` of input `x` plus this delta, added in float32, returned in x's dtype."""
        return (y.astype(jnp.float32) + self.delta(x)).astype(x.dtype)


class NoAdapter:
    """A fused weight's part without an adapter (`layers.fused_linears`' default): adds nothing."""

    def added_to(self, x: jax.Array, y: jax.Array) -> jax.Array:
        del x
        return y


NO_ADAPTER = NoAdapter()


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LoRAWeight(WeightForm):
    """A base weight (any form) plus its adapters: the base's linear output (bias added, cast to x's dtype) with
    each token's delta added."""

    base: WeightForm
    adapter: LoRAAdapter

    def matmul(self, x: jax.Array) -> jax.Array:
        return self.base.matmul(x) + self.adapter.delta(x)

    def linear(self, x: jax.Array, bias: jax.Array | None = None) -> jax.Array:
        return self.adapter.added_to(x, self.base.linear(x, bias))

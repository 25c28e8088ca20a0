"""LoRA inside the forward: each token's adapter slot (`LoRAMask`), a base linear weight wrapped with every layer's
adapter stacks (`LoRAWeight`, whose delta `layers.linear` adds), and `bundle_lora` wrapping one layer's targets
(docs/architecture/11-lora.md, "LoRA adapters")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp


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
    `lora`: target name -> (a [L, N, in, R], b [L, N, R, out]), every layer's slots."""
    if not lora:
        return w
    out = dict(w)
    for name, (a, b) in lora.items():
        out[name] = LoRAWeight(out[name], a, b, mask, layer)
    return out

"""The one interface of a linear weight inside the forward (docs/architecture/06-model.md, "Weight forms").

A form holds whatever arrays its format stores (a float matrix, GGUF blocks, int8 / fp8 values and their scales, a
base weight plus LoRA adapters, one matrix per layer behind a switch) and computes x @ W from them. The layer code
asks a form for `matmul` (float32) or `linear` (bias added, the input's dtype); forms that can share one call for
several weights (q / k / v, gate / up) say so with equal `join_key`s, and the first computes them all
(`matmuls`). Every form is a registered pytree dataclass, so it can cross `jit`, `switch` and `cond`."""

from __future__ import annotations

import abc
from collections.abc import Hashable, Sequence

import jax
import jax.numpy as jnp


class WeightForm(abc.ABC):
    """A linear weight [in, out] in some stored form: x [..., in] -> x @ W [..., out]."""

    @abc.abstractmethod
    def matmul(self, x: jax.Array) -> jax.Array:
        """float32 x @ W (accumulated in float32; int32 for W8A8's int8 dot, then scaled)."""

    def linear(self, x: jax.Array, bias: jax.Array | None = None) -> jax.Array:
        """x @ W (+ bias, added in float32), returned in x's dtype."""
        y = self.matmul(x)
        if bias is not None:
            y = y + bias.astype(jnp.float32)
        return y.astype(x.dtype)

    @property
    def join_key(self) -> Hashable | None:
        """Forms with the same key compute their products in one call (`matmul_joined`); None: never joined."""
        return None

    def matmul_joined(self, x: jax.Array, forms: Sequence[WeightForm]) -> list[jax.Array]:
        """float32 x @ W of each of `forms` (this one among them, all with its `join_key`) in one call."""
        return [form.matmul(x) for form in forms]


def joined_matmuls(x: jax.Array, forms: Sequence[WeightForm]) -> list[jax.Array] | None:
    """float32 x @ W of each form as one call when they share a `join_key`, else None."""
    key = forms[0].join_key
    if key is None or any(form.join_key != key for form in forms[1:]):
        return None
    return forms[0].matmul_joined(x, forms)


def matmuls(x: jax.Array, forms: Sequence[WeightForm]) -> list[jax.Array]:
    """float32 x @ W of each form: one call when they join, else one each."""
    joined = joined_matmuls(x, forms)
    return [form.matmul(x) for form in forms] if joined is None else joined

"""A weight stored as one plain array [in, out]: the model dtype, or the int8 / fp8 values under a scaled form
(their dot converts them to the activations' dtype, or for W8A8 accumulates int8 x int8 in int32:
quantized_dots.dot). A plain array handed to the layer code is this form (`as_weight_form`)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from vllm_jax.model.quantized_dots import float_dots, grouped_dot
from vllm_jax.model.weight_forms.base import WeightForm


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class DenseWeight(WeightForm):
    """x @ W of a plain array; on CPU at a few float32 rows by the native kernel (quantized_dots.float_dots)."""

    array: jax.Array

    def matmul(self, x: jax.Array) -> jax.Array:
        return float_dots(x, [self.array])[0].astype(jnp.float32)

    @property
    def join_key(self) -> Hashable:
        return "dense"

    def matmul_joined(self, x: jax.Array, forms: Sequence[DenseWeight]) -> list[jax.Array]:
        """All the arrays in one `float_dots` call (on CPU one native call)."""
        return [y.astype(jnp.float32) for y in float_dots(x, [form.array for form in forms])]

    def partial_sums(self, x: jax.Array, groups: int) -> jax.Array:
        """float32 [..., groups, out]: each run of in // groups input rows' share of x @ W (grouped scales)."""
        return grouped_dot(x, self.array, groups)


def as_weight_form(weight: WeightForm | jax.Array) -> WeightForm:
    """`weight` as a form: a plain array (the families' own params, an unquantized layer's linears) is a
    DenseWeight; every other form arrives as its object. The one place the layer code meets a bare array."""
    return weight if isinstance(weight, WeightForm) else DenseWeight(weight)

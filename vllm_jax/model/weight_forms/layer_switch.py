"""One layer's weight inside a scan over per-layer arrays, picked by a switch over the layers.

XLA:CPU copies a dynamic slice of a stacked weight out before every dot (its dot reads whole buffers); a switch
branch reads its operand in place, and the layer body is still compiled once (docs/architecture/06-model.md,
"Embedding, head and layer loop"). Built by `bundle.switched_forms` for the CPU default scan
(model/layer_loop.py)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax

from vllm_jax.model.weight_forms.base import WeightForm, matmuls


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LayerSwitch(WeightForm):
    """`forms[index]`'s products: each layer's form (a DenseWeight, or GGUF blocks) as one branch of a switch."""

    forms: tuple[WeightForm, ...]
    index: jax.Array

    def matmul(self, x: jax.Array) -> jax.Array:
        return switch_layers(self.index, self.forms, _matmul, x)

    def partial_sums(self, x: jax.Array, groups: int) -> jax.Array:
        """The layer's DenseWeight.partial_sums (grouped scales weight them outside the switch)."""
        return switch_layers(self.index, self.forms, partial(_partial_sums, groups=groups), x)

    @property
    def join_key(self) -> Hashable:
        return ("layer switch", id(self.index))  # switches on the same index share one switch

    def matmul_joined(self, x: jax.Array, forms: Sequence[LayerSwitch]) -> list[jax.Array]:
        """One switch whose branch computes its layer's products of every form, joined where they join (q / k / v
        of one layer in one native call)."""
        per_layer = tuple(zip(*(form.forms for form in forms)))
        return switch_layers(self.index, per_layer, _joined, x)


def switch_layers(index: jax.Array, per_layer: tuple, fn: Callable[[jax.Array, Any], Any], x: jax.Array) -> Any:
    """fn(x, per_layer[index]) as a switch over the layers: every branch gets the whole tuple as its operand."""
    branches = [partial(_apply_nth, fn, n) for n in range(len(per_layer))]
    return jax.lax.switch(index, branches, x, per_layer)


def _apply_nth(fn: Callable[[jax.Array, Any], Any], n: int, x: jax.Array, per_layer: tuple) -> Any:
    return fn(x, per_layer[n])


def _matmul(x: jax.Array, form: WeightForm) -> jax.Array:
    return form.matmul(x)


def _partial_sums(x: jax.Array, form: Any, groups: int) -> jax.Array:
    return form.partial_sums(x, groups)


def _joined(x: jax.Array, forms: tuple[WeightForm, ...]) -> list[jax.Array]:
    return matmuls(x, forms)

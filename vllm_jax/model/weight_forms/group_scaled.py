"""fp8 values with block scales (a pre-quantized checkpoint's [128 out x 128 in] blocks, read by
model_loader/prequantized_checkpoint.py): one float32 scale per output channel and run of g input rows,
[in // g, out], so w ~= values * scale[k // g, :] for input row k (model/quantization.py)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from vllm_jax.model.weight_forms.base import WeightForm
from vllm_jax.model.weight_forms.dense import DenseWeight
from vllm_jax.model.weight_forms.layer_switch import LayerSwitch


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class GroupScaledWeight(WeightForm):
    """Weight-only: each group of input rows' share of x @ values (the values converted to x's dtype inside the
    dot), weighted by that group's scales, then summed."""

    values: DenseWeight | LayerSwitch
    scale: jax.Array

    def matmul(self, x: jax.Array) -> jax.Array:
        parts = self.values.partial_sums(x, self.scale.shape[0])
        return jnp.sum(parts * self.scale, axis=-2).astype(jnp.float32)

"""int8 / fp8 values with one float32 scale per output channel (`--quantization int8 | fp8`, quantized as a
float checkpoint loads, or a pre-quantized checkpoint's per-channel / per-tensor scales: model_loader/
tensor_loader.py and prequantized_checkpoint.py). w ~= values * scale[None, :] (model/quantization.py).

Weight-only (fp8, and int8 on TPU / GPU): the values converted to the activations' dtype inside the dot, the
output scaled per channel. W8A8 (int8 on CPU): each activation row quantized to int8 too, the dot accumulated in
int32, the output scaled by row scale x channel scale (docs/architecture/06-model.md, "Quantized weights")."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax

from vllm_jax.model.quantization import quantize_rows
from vllm_jax.model.weight_forms.base import WeightForm


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ChannelScaledWeight(WeightForm):
    """`values` (a DenseWeight of the int8 / float8_e4m3fn matrix, or a LayerSwitch over per-layer ones), float32
    `scale` [out], and whether the activations are quantized too (W8A8; static, from the model's Quantization)."""

    values: WeightForm
    scale: jax.Array
    quantize_activations: bool = field(metadata={"static": True})

    def matmul(self, x: jax.Array) -> jax.Array:
        if self.quantize_activations:
            xq, row_scale = quantize_rows(x)
            return self.values.matmul(xq) * row_scale * self.scale
        return self.values.matmul(x) * self.scale

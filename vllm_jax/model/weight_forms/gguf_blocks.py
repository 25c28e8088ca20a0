"""A weight kept in a GGUF file's own blocks (`--quantization gguf`: Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K), the
layout of model/grouped_quant.py, rebuilt inside the dot (docs/architecture/06-model.md, "Quantized weights").
Its loader: model_loader/gguf_file (the kept formats read by kept.py)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

from vllm_jax.model.quantized_dots import gguf_dot, gguf_dots
from vllm_jax.model.weight_forms.base import WeightForm


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class GGUFBlocksWeight(WeightForm):
    """values (int8 [in, out] or two 4-bit values a byte, uint8 [in // 2, out]), scales and, for Q4_1 / Q4_K, mins
    [in // rows, out] (float16, K-quants float32) of format `fmt` (static)."""

    values: jax.Array
    scale: jax.Array
    minimum: jax.Array | None
    fmt: str = field(metadata={"static": True})

    def matmul(self, x: jax.Array) -> jax.Array:
        return gguf_dot(x, self.values, self.scale, self.minimum, self.fmt).astype(jnp.float32)

    @property
    def join_key(self) -> Hashable:
        return "gguf blocks"

    def matmul_joined(self, x: jax.Array, forms: Sequence[GGUFBlocksWeight]) -> list[jax.Array]:
        """All the weights in one `gguf_dots` call (on CPU one native call at a few rows)."""
        return gguf_dots(x, [(form.values, form.scale, form.minimum, form.fmt) for form in forms])

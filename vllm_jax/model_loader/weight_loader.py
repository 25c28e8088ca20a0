"""The one protocol every weight format implements (`WeightLoader`), and the request each loader is given.

A loader turns a model's abstract params into placed arrays: every param path of `LoadRequest.shapes` gets
an array of that shape, in the request's dtype, on `sharding_for(path, shape)`. The formats: HF-named
tensors through a weight map (`tensor_loader.TensorLoader`, over safetensors shards or a GGUF file), a
`vllm-jax convert` directory (`orbax_io.ConvertedLoader`) and seeded random weights
(`random_weights.RandomWeights`); `loader.build_model` picks one for a `ModelSource`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import jax
import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    from flax import nnx

    from vllm_jax.model.spec import DecoderSpec

NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}

ParamPath = tuple[str, ...]
ShardingFor = Callable[[ParamPath, tuple[int, ...]], jax.sharding.Sharding]


@dataclass(frozen=True)
class LoadRequest:
    """The params a loader must produce, and how to place them."""

    spec: DecoderSpec
    shapes: dict[ParamPath, tuple[int, ...]]  # every param of the model, by path
    dtype: str  # a key of NP_DTYPES
    sharding_for: ShardingFor
    init_model: Callable[[nnx.Rngs], nnx.Module]  # the model with its own random init (for random weights)
    # --quantization (model/quantization.py): the linear weights with a `{name}_scale` sibling in `shapes` are
    # quantized at load, from the float checkpoint
    quantization: str | None = None


class WeightLoader(Protocol):
    def load(self, request: LoadRequest) -> dict[ParamPath, jax.Array]:
        """Every param of `request.shapes`, placed; a bad checkpoint is one ModelSourceError naming its file."""
        ...


def flatten_params(tree: dict, prefix: ParamPath = ()) -> dict[ParamPath, Any]:
    """A pure param dict (`nnx.to_pure_dict`) as {path: leaf}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten_params(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def unflatten_params(flat: dict[ParamPath, Any]) -> dict:
    """The inverse of `flatten_params`."""
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree

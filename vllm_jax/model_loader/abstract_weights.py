"""Abstract weights: every param a ShapeDtypeStruct on its sharding, nothing allocated or read.

The loader of `build_model(..., abstract=True)`, for the engine's ahead-of-time construction
(worker/engine_builder.py): the same model, shardings and layer layout as a checkpoint's load, so the programs
compiled over them are the runner's own.
"""

from __future__ import annotations

import jax
from flax import nnx

from vllm_jax.model_loader.weight_loader import LoadRequest, ParamPath, flatten_params


class AbstractWeights:
    """The modules' own params as `nnx.eval_shape` gives them (shape and dtype), each on its request's sharding."""

    def load(self, request: LoadRequest) -> dict[ParamPath, jax.ShapeDtypeStruct]:
        model = nnx.eval_shape(lambda: request.init_model(nnx.Rngs(0)))
        values = flatten_params(nnx.to_pure_dict(nnx.state(model)))
        return {path: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=request.sharding_for(path, value.shape))
                for path, value in values.items()}

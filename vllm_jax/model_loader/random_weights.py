"""Seeded random weights, placed like a checkpoint's: research scripts, tests and benchmarks without a file."""

from __future__ import annotations

import jax
from flax import nnx

from vllm_jax.model_loader.weight_loader import LoadRequest, ParamPath, flatten_params


class RandomWeights:
    """The modules' own init (normal weights, unit norms, zero biases) from `nnx.Rngs(seed)`."""

    def __init__(self, seed: int):
        self.seed = seed

    def load(self, request: LoadRequest) -> dict[ParamPath, jax.Array]:
        model = request.init_model(nnx.Rngs(self.seed))
        values = flatten_params(nnx.to_pure_dict(nnx.state(model)))
        return {path: jax.device_put(value, request.sharding_for(path, value.shape))
                for path, value in values.items()}

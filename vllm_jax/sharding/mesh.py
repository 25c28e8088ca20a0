"""Device meshes with the named axes ("data", "model").

We use Auto axis types: params and the KV cache carry NamedShardings and GSPMD propagates them through the
step, so the model code has no collectives and no explicit resharding. (Explicit axes would make every
reshape of a sharded head axis spell out its sharding; the gain is nil for a forward pass whose layout is fixed
by the params.) Expert parallelism reuses the "model" axis for the expert dimension of MoE weights
(docs/architecture/09-sharding.md, "Sharding").
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

DATA_AXIS = "data"
MODEL_AXIS = "model"


def make_mesh(tensor_parallel_size: int = 1, data_parallel_size: int = 1, devices: list | None = None) -> Mesh:
    """A [data, model] mesh over the first dp * tp devices; a clear error when they do not exist. Experts shard over
    the "model" axis, so expert parallelism needs no other mesh."""
    if tensor_parallel_size < 1 or data_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size and data_parallel_size must be >= 1; got "
                         f"{tensor_parallel_size}, {data_parallel_size}")
    devices = list(devices if devices is not None else jax.devices())
    needed = tensor_parallel_size * data_parallel_size
    if needed > len(devices):
        raise ValueError(f"tensor_parallel_size ({tensor_parallel_size}) x data_parallel_size "
                         f"({data_parallel_size}) needs {needed} devices but only {len(devices)} "
                         f"{devices[0].platform if devices else ''} device(s) exist")
    grid = np.array(devices[:needed], dtype=object).reshape(data_parallel_size, tensor_parallel_size)
    return Mesh(grid, (DATA_AXIS, MODEL_AXIS), axis_types=(AxisType.Auto, AxisType.Auto))


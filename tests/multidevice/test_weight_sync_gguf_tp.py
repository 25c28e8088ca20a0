"""The multi-device tests of tests/engine/test_weight_sync_gguf.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from tests.engine.test_weight_sync_gguf import (
    ARGS,
    files,  # noqa: F401  (a fixture)
)
from vllm_jax import EngineArgs


def test_tensor_parallel_kept_update_equals_a_fresh_load(files):  # noqa: F811
    """TP 2 on fake CPU devices: the requantized blocks, scales and mins land on the shardings a fresh load of
    B's GGUF gives them, with its values (no step runs, so nothing compiles)."""
    from vllm_jax.worker.model_runner import ModelRunner

    def runner(path):
        return ModelRunner(EngineArgs(model=str(path), **{**ARGS, "num_gpu_blocks_override": 9,
                                                          "tensor_parallel_size": 2}).create_config())

    updated, fresh = runner(files["a"]), runner(files["b"])
    updated.update_weights(files["b_float"])
    for got, want in zip(jax.tree.leaves(nnx.to_pure_dict(updated.params)),
                         jax.tree.leaves(nnx.to_pure_dict(fresh.params))):
        assert got.sharding == want.sharding and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

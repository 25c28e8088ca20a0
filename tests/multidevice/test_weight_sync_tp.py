"""The multi-device tests of tests/engine/test_weight_sync.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from tests.engine.test_weight_sync import (
    ARGS,
    checkpoints,  # noqa: F401  (a fixture)
    engine_on,
    greedy,
    leaves,
)
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax import EngineArgs
from vllm_jax.model.fused_projections import qkv_layout


def test_tensor_parallel_update_equals_a_fresh_tp2_engine(checkpoints):  # noqa: F811
    """TP 2 on the session's fake CPU devices: every new array lands on its param's sharding."""
    fresh_b = greedy(engine_on(checkpoints[1], tensor_parallel_size=2))
    tp = engine_on(checkpoints[0], tensor_parallel_size=2)
    greedy(tp)
    traces = tp.runner.num_compilations
    specs = [leaf.sharding for leaf in leaves(tp)]
    tp.update_weights(load_file(str(checkpoints[1] / "model.safetensors")))
    assert [leaf.sharding for leaf in leaves(tp)] == specs
    assert greedy(tp) == fresh_b
    assert tp.runner.num_compilations == traces


@pytest.mark.parametrize("arch, args, by_parts", [
    ("qwen3_moe", dict(tensor_parallel_size=2, enable_expert_parallel=True), False),  # stacked experts, split
    ("llama", dict(quantization="int8"), False),  # the update arrives in float and is quantized by the load's rule
    ("llama", dict(tensor_parallel_size=2), True),  # fused q/k/v, fed part by part
])
def test_update_equals_a_fresh_load(tmp_path, arch, args, by_parts):
    """Param for param, sharding for sharding: a runner on A updated with B's tensors holds what a runner built
    on B holds (no step runs, so nothing compiles). The fused q/k/v (model/fused_projections.py) may be fed one
    part at a time, as trainers that send tensor by tensor do: the parts an update leaves out keep their values,
    and a part given as a jax.Array is placed from its devices."""
    from vllm_jax.worker.model_runner import ModelRunner

    make_tiny_checkpoint(arch, tmp_path / "a", seed=1)
    make_tiny_checkpoint(arch, tmp_path / "b", seed=2)

    def runner(path):
        return ModelRunner(EngineArgs(model=str(path), **{**ARGS, "num_gpu_blocks_override": 9, **args})
                           .create_config())

    updated, fresh = runner(tmp_path / "a"), runner(tmp_path / "b")
    tensors = load_file(str(tmp_path / "b" / "model.safetensors"))
    if arch == "qwen3_moe":  # one expert of a layer alone cannot be placed: its layer's experts are one array
        with pytest.raises(ValueError, match="together"):
            updated.update_weights({"model.layers.0.mlp.experts.1.up_proj.weight":
                                    tensors["model.layers.0.mlp.experts.1.up_proj.weight"]})
    if by_parts:
        def k_of_layer0(r) -> np.ndarray:
            return np.asarray(qkv_layout(r.spec).split(nnx.to_pure_dict(r.params)["layers"]["qkv_proj"][0])[1])

        k_of_a = k_of_layer0(updated)
        q_and_gate = {n: jax.numpy.asarray(t) for n, t in tensors.items()
                      if n.endswith(("q_proj.weight", "gate_proj.weight"))}
        updated.update_weights(q_and_gate)
        np.testing.assert_array_equal(k_of_layer0(updated), k_of_a)  # the parts left out keep A's values
        tensors = {n: t for n, t in tensors.items() if n not in q_and_gate}
    updated.update_weights(tensors)
    for got, want in zip(jax.tree.leaves(nnx.to_pure_dict(updated.params)),
                         jax.tree.leaves(nnx.to_pure_dict(fresh.params))):
        assert got.sharding == want.sharding and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

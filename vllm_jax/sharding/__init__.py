"""Meshes and partition rules for tensor / expert / data parallelism."""

from vllm_jax.sharding.mesh import DATA_AXIS, MODEL_AXIS, make_mesh
from vllm_jax.sharding.rules import (
                                     check_tensor_parallel_layout,
                                     eagle3_param_partition_spec,
                                     kv_cache_partition_spec,
                                     kv_heads_sharded,
                                     param_partition_spec,
)

__all__ = ["DATA_AXIS", "MODEL_AXIS", "make_mesh", "check_tensor_parallel_layout", "eagle3_param_partition_spec",
           "kv_cache_partition_spec", "kv_heads_sharded", "param_partition_spec"]

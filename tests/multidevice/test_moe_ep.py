"""The multi-device tests of tests/engine/test_moe.py, on the session's fake CPU devices (tests/conftest.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.model.moe import grouped_expert_ffn, route


def test_expert_parallel_ffn_on_four_devices_equals_single_device():
    """Experts split over 4 of the session's fake CPU devices (tests/conftest.py): the same FFN output."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from vllm_jax.model.moe import expert_parallel_ffn
    from vllm_jax.sharding.mesh import make_mesh

    mesh = make_mesh(tensor_parallel_size=4)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(40, 16)), jnp.float32)
    router = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)
    ws = [jnp.asarray(rng.normal(size=s) * 0.3, jnp.float32) for s in ((8, 16, 24), (8, 16, 24), (8, 24, 16))]
    weights, ids = route(x, router, 2, True, False)
    ref = grouped_expert_ffn(x, weights, ids, *ws)
    sharded = [jax.device_put(w, NamedSharding(mesh, P("model"))) for w in ws]
    got = jax.jit(lambda *a: expert_parallel_ffn(mesh, "model", *a))(x, weights, ids, *sharded)
    assert mesh.devices.size == 4
    assert float(jnp.max(jnp.abs(got - ref))) < 1e-5

"""The Pallas kernels under shard_map on the session's 8 fake CPU devices (tests/conftest.py), in interpret mode:
`main()` returns one JSON-shaped dict that tests/multidevice/test_kernel_sharding.py reads."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.helpers import attention_oracle as oracle
from tests.helpers.ragged_batches import make_batch
from vllm_jax.attention import attention_backend_for
from vllm_jax.pallas_kernels.kv_layout import from_interleaved, to_interleaved
from vllm_jax.sharding.mesh import make_mesh
from vllm_jax.sharding.rules import kv_head_layout

# (name, KV heads, GQA group, head_dim, dtype, sliding window); the "sinks" case also passes attention sinks
# (gpt-oss), split with the query heads in both layouts (tp 2 sharded, tp 4 replicated)
CASES = [("kv4_g2", 4, 2, 64, jnp.float32, None), ("kv2_g4_window_sinks", 2, 4, 128, jnp.bfloat16, 7)]
BACKENDS = {"pallas_tpu": dict(interpret=True), "pallas_gpu": dict(interpret=True)}
ALL_BACKENDS = {**BACKENDS, "xla": {}}


def _batch(num_kv_heads: int, group: int, head_dim: int, dtype, seed: int):
    return make_batch("mixed", group=group, head_dim=head_dim, dtype=dtype, block_size=16, layers=2, seed=seed,
                      num_kv_heads=num_kv_heads)


def _place(mesh, x, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


def attention(backend: str, case, tp: int) -> tuple[np.ndarray, int, str]:
    _, num_kv_heads, group, head_dim, dtype, window = case
    q, cache, tables, lens, qsl, n, total = _batch(num_kv_heads, group, head_dim, dtype, seed=3)
    sinks = _sinks(case, q.shape[1])
    mesh = make_mesh(tensor_parallel_size=tp)
    layout = kv_head_layout(num_kv_heads, tp, q.shape[1])
    cache_spec = _cache_spec(backend) if layout == "sharded" and tp > 1 else P()
    if backend == "pallas_tpu":  # its lane-dense cache (pallas_kernels/kv_layout.py)
        cache = from_interleaved(cache)
    q = _place(mesh, q, P(None, "model", None))
    cache = _place(mesh, cache, cache_spec)
    fn = jax.jit(functools.partial(attention_backend_for(backend, **BACKENDS[backend]).attention,
                                   sm_scale=head_dim ** -0.5, soft_cap=None, mesh=mesh))
    out = fn(q, cache, tables, lens, qsl, n, sliding_window=None if window is None else jnp.int32(window),
             layer_index=jnp.int32(1), sinks=None if sinks is None else _place(mesh, sinks, P("model")))
    return np.asarray(out, np.float32)[:total], total, layout


def _cache_spec(backend: str) -> P:
    """The sharded cache's spec: pallas_tpu's lane-dense rows split on their last axis, else the head axis."""
    return P(None, None, None, "model") if backend == "pallas_tpu" else P(None, None, None, "model", None)


def _sinks(case, num_q_heads: int):
    """Per-head sinks around the scores' scale (some dominate a row, some barely count), for the sinks case."""
    if "sinks" not in case[0]:
        return None
    return jnp.asarray(np.random.default_rng(5).normal(0.0, 2.0, num_q_heads), jnp.float32)


def kv_write(backend: str, num_kv_heads: int, tp: int) -> np.ndarray:
    cache, k, v, slots = _write_inputs(num_kv_heads)
    mesh = make_mesh(tensor_parallel_size=tp)
    sharded = kv_head_layout(num_kv_heads, tp) == "sharded" and tp > 1
    if backend == "pallas_tpu":
        cache = from_interleaved(cache)
    cache = _place(mesh, cache, _cache_spec(backend) if sharded else P())
    k, v = (_place(mesh, x, P(None, "model", None) if sharded else P()) for x in (k, v))
    fn = jax.jit(functools.partial(attention_backend_for(backend, **BACKENDS[backend]).write_kv_cache, mesh=mesh),
                 donate_argnums=0)
    got = fn(cache, k, v, slots, layer_index=jnp.int32(1))
    spec = got.sharding.spec
    if backend == "pallas_tpu":
        got = to_interleaved(got, k.shape[-1])
    return np.asarray(got, np.float32), spec


def _write_inputs(num_kv_heads: int):
    rng = np.random.default_rng(7)
    head_dim, block_size, num_tokens = 64, 8, 13
    cache = jnp.asarray(rng.standard_normal((2, 10, block_size, 2 * num_kv_heads, head_dim)), jnp.bfloat16)
    slots = jnp.asarray(np.concatenate([rng.choice(np.arange(block_size, 10 * block_size), num_tokens - 3,
                                                   replace=False), [0, 1, 2]]), jnp.int32)
    k, v = (jnp.asarray(rng.standard_normal((num_tokens, num_kv_heads, head_dim)), jnp.float32) for _ in "kv")
    return cache, k, v, slots


def mla_attention(backend: str, tp: int) -> np.ndarray:
    """DeepSeek MLA over 8 heads, the latent cache replicated and the heads split over tp devices."""
    from tests.engine.test_mla_kernels import RANK, ROPE, mla_batch

    q_latent, q_rope, cache, *batch, total = mla_batch("mixed", 9, 8, heads=8)
    mesh = make_mesh(tensor_parallel_size=tp)
    q_latent, q_rope = (_place(mesh, x, P(None, "model", None)) for x in (q_latent, q_rope))
    fn = jax.jit(functools.partial(attention_backend_for(backend, **ALL_BACKENDS[backend]).mla_attention,
                                   sm_scale=(RANK + ROPE) ** -0.5, mesh=mesh))
    out = fn(q_latent, q_rope, _place(mesh, cache, P()), *batch, layer_index=jnp.int32(1))
    return np.asarray(out, np.float32)[:total]


def main() -> dict:
    result: dict = {}
    for backend in BACKENDS:
        base = mla_attention(backend, 1)
        result[f"{backend}/mla/tp1_vs_xla"] = float(np.max(np.abs(base - mla_attention("xla", 1))))
        for tp in (2, 4):
            result[f"{backend}/mla/tp{tp}"] = float(np.max(np.abs(mla_attention(backend, tp) - base)))
        for case in CASES:
            name = case[0]
            base, total, _ = attention(backend, case, 1)
            _, num_kv_heads, group, head_dim, dtype, window = case
            q, cache, tables, lens, qsl, n, _ = _batch(num_kv_heads, group, head_dim, dtype, seed=3)
            want = oracle.attention(q, cache, tables, lens, qsl, n, sm_scale=head_dim ** -0.5,
                                    sliding_window=window, layer_index=1, sinks=_sinks(case, q.shape[1]))
            result[f"{backend}/{name}/tp1_vs_oracle"] = float(np.max(np.abs(base - want)))
            for tp in (2, 4):
                out, _, layout = attention(backend, case, tp)
                result[f"{backend}/{name}/tp{tp}"] = {"layout": layout, "max_diff": float(np.max(np.abs(out - base)))}
        for num_kv_heads in (4, 2):
            base, _ = kv_write(backend, num_kv_heads, 1)
            want = oracle.write_kv(*_write_inputs(num_kv_heads), layer_index=1)
            result[f"{backend}/kv_write_kv{num_kv_heads}/tp1_equals_oracle"] = bool(
                np.array_equal(base, want.astype(np.float32)))
            for tp in (2, 4):
                got, spec = kv_write(backend, num_kv_heads, tp)
                result[f"{backend}/kv_write_kv{num_kv_heads}/tp{tp}"] = {
                    "equal": bool(np.array_equal(got, base)), "spec": [str(s) for s in spec]}
    return result

"""The Pallas MLA kernels (pallas_kernels/tpu_mla_attention.py, gpu_mla_attention.py) in interpret mode against the
XLA MLA path (mla_attention.mla_ragged_paged_attention) and the dense numpy oracle (tests/helpers/attention_oracle.py,
fed the latent row as both the key and the value of one KV head), on ragged mixed prefill / decode batches with
chunked prefill over earlier pages, padding rows and sequence slots, and pages shuffled through the cache."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import attention_oracle as oracle
from tests.helpers.ragged_batches import _lengths, paged_batch
from vllm_jax.attention import attention_backend_for
from vllm_jax.pallas_kernels import gpu_mla_attention, mla_attention, tpu_attention, tpu_mla_attention

RANK, ROPE, HEADS, WIDTH = 16, 8, 4, 128  # the latent row: 16 + 8 used lanes, padded to 128
FP8 = jnp.float8_e4m3fn


def mla_batch(kind: str, seed: int, block_size: int, dtype=jnp.float32, heads: int = HEADS):
    """(q_latent, q_rope, cache [2 layers, blocks, block, 1, WIDTH], tables, seq_lens, qsl, num_seqs, real rows).
    The row's padding lanes hold zeros, as write_mla_cache leaves them."""
    rng = np.random.default_rng(seed)
    q_lens, ctx = _lengths(kind, rng)
    q, kv, tables, seq_lens, qsl, num_seqs, real = paged_batch(
        q_lens, q_lens + ctx, rng=rng, block_size=block_size, num_kv_heads=1, q_heads=heads,
        head_dim=RANK + ROPE, dtype=jnp.float32, layers=2)
    kv = jnp.pad(kv[:, :, :, :1], ((0, 0),) * 4 + ((0, WIDTH - RANK - ROPE),)).astype(dtype)
    q = q.astype(dtype)
    return q[..., :RANK], q[..., RANK:], kv, tables, seq_lens, qsl, num_seqs, real


def _dense_oracle(q_latent, q_rope, kv, tables, seq_lens, qsl, num_seqs, *, sm_scale, layer_index, scale=1.0):
    """The oracle's GQA attention with one KV head whose key and value are both the (dequantized) row."""
    row = np.asarray(kv[layer_index], np.float64) * scale
    cache = np.concatenate([row, row], axis=-2)  # k0 = v0 = the row
    q = np.concatenate([np.asarray(q_latent, np.float64), np.asarray(q_rope, np.float64)], -1)
    q = np.pad(q, ((0, 0), (0, 0), (0, WIDTH - q.shape[-1])))
    return oracle.attention(q, cache, tables, seq_lens, qsl, num_seqs, sm_scale=sm_scale)[..., :RANK]


TPU_RUNS = {
    "tpu_interpreter_small_tiles": dict(interpret=tpu_attention.interpret_params(), tq=4, pages_per_block=2),
    "tpu_generic_default_plan": dict(interpret=True),
}


@pytest.mark.parametrize("run, kind", [("tpu_interpreter_small_tiles", "mixed"),
                                       ("tpu_generic_default_plan", "prefill"), ("tpu_generic_default_plan", "decode")])
def test_tpu_mla_kernel_matches_xla_path_and_oracle(run, kind):
    """Small tiles split sequences and the page prefetch crosses page blocks and sequences (InterpretParams: DMAs
    land at their wait, fresh VMEM is NaN); the default plan takes the whole batch in one tile."""
    seed = {"mixed": 0, "decode": 1, "prefill": 2}[kind]
    block = 4 if run.startswith("tpu_interpreter") else 8
    q_lat, q_rope, kv, *batch, real = mla_batch(kind, seed, block)
    scale = (RANK + ROPE) ** -0.5
    want = _dense_oracle(q_lat, q_rope, kv, *batch, sm_scale=scale, layer_index=1)
    xla = np.asarray(mla_attention.mla_ragged_paged_attention(q_lat, q_rope, kv, *batch, sm_scale=scale,
                                                              layer_index=1))
    q = mla_attention.mla_query(q_lat, q_rope, WIDTH)
    fn = jax.jit(functools.partial(tpu_mla_attention.mla_attention_tpu, kv_lora_rank=RANK, sm_scale=scale,
                                   **TPU_RUNS[run]))
    got = np.asarray(fn(q, kv, *batch, layer_index=jnp.int32(1)))
    assert got.shape == (q.shape[0], HEADS, RANK) and np.isfinite(got).all()
    np.testing.assert_allclose(xla[:real], want, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(got[:real], want, atol=2e-5, rtol=2e-5)


GPU_RUNS = {"gpu_split3_rows16": dict(num_splits=3, rows=16), "gpu_one_split": dict(num_splits=1)}


@pytest.mark.parametrize("run, kind", [("gpu_split3_rows16", "mixed"), ("gpu_one_split", "decode")])
def test_gpu_mla_kernel_matches_xla_path_and_oracle(run, kind):
    """Uneven flash-decoding splits with 2-token tiles of 8 heads (6 real: a padded head block), and one split
    (normalized in the kernel, no merge)."""
    q_lat, q_rope, kv, *batch, real = mla_batch(kind, 3 + len(kind), 8, heads=6)  # 6 heads: a padded head block
    scale = (RANK + ROPE) ** -0.5
    want = _dense_oracle(q_lat, q_rope, kv, *batch, sm_scale=scale, layer_index=1)
    q = mla_attention.mla_query(q_lat, q_rope, WIDTH)
    fn = jax.jit(functools.partial(gpu_mla_attention.mla_attention_gpu, kv_lora_rank=RANK, qk_rope_head_dim=ROPE,
                                   sm_scale=scale, interpret=True, **GPU_RUNS[run]))
    got = np.asarray(fn(q, kv, *batch, layer_index=jnp.int32(1)))
    assert got.shape == (q.shape[0], 6, RANK) and np.isfinite(got).all()
    np.testing.assert_allclose(got[:real], want, atol=2e-5, rtol=2e-5)


KV_SCALE = 0.5  # not 1.0, so a kernel that drops the scale fails; a power of two, so row / scale is exact


@pytest.mark.parametrize("backend", ["pallas_tpu", "pallas_gpu"])
def test_fp8_cache_kernels_equal_the_xla_path_with_the_scale_folded(backend):
    """An fp8 (e4m3) latent cache holding row / KV_SCALE: each kernel equals the XLA path over the same cache, and
    the XLA path equals the oracle on the dequantized rows (fp8 value x KV_SCALE)."""
    q_lat, q_rope, kv, *batch, real = mla_batch("mixed", 7, 8)
    kv = jnp.asarray(np.clip(np.asarray(kv) / KV_SCALE, -448, 448)).astype(FP8)
    scale = (RANK + ROPE) ** -0.5
    kwargs = dict(sm_scale=scale, layer_index=jnp.int32(1), kv_scale=KV_SCALE)
    want = _dense_oracle(q_lat, q_rope, np.asarray(kv, np.float32), *batch, sm_scale=scale, layer_index=1,
                         scale=KV_SCALE)
    xla = np.asarray(attention_backend_for("xla").mla_attention(q_lat, q_rope, kv, *batch, **kwargs))
    kernels = attention_backend_for(backend, "cpu")  # interpret mode, on whatever device the test runs
    got = np.asarray(jax.jit(functools.partial(kernels.mla_attention, **kwargs))(
        q_lat, q_rope, kv, *batch))
    np.testing.assert_allclose(xla[:real], want, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(got[:real], xla[:real], atol=2e-5, rtol=2e-5)
    unscaled = np.asarray(attention_backend_for("xla").mla_attention(q_lat, q_rope, kv, *batch, sm_scale=scale,
                                                                      layer_index=jnp.int32(1)))
    assert np.abs(unscaled[:real] - want).max() > 0.1  # the scale matters at this tolerance


def test_bad_mla_shapes_are_refused_by_name():
    q_lat, q_rope, kv, *batch, _ = mla_batch("decode", 1, 8)
    with pytest.raises(ValueError, match="power-of-two kv_lora_rank"):
        attention_backend_for("pallas_gpu", "cpu").mla_attention(q_lat[..., :12], q_rope, kv, *batch, sm_scale=1.0)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        attention_backend_for("pallas_tpu", "cpu").mla_attention(q_lat, q_rope, kv[..., :20], *batch, sm_scale=1.0)


def test_mla_kernels_lower_to_mosaic_and_triton_for_deepseek_v3_heads():
    """DeepSeek-V3's attention at TP 1 (128 heads, kv_lora_rank 512, rope 64, a 640-wide row), bfloat16 with a
    bfloat16 and an fp8 cache: the TPU kernel lowers to a Mosaic call and the GPU kernel to a Triton call."""
    i32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)
    for kv_dtype in (jnp.bfloat16, FP8):
        bf16 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.bfloat16)
        args = (bf16((64, 128, 512)), bf16((64, 128, 64)),
                jax.ShapeDtypeStruct((2, 64, 16, 1, 640), kv_dtype), i32((8, 256)), i32((8,)), i32((9,)), i32((1,)),
                i32(()))
        for backend, platform, marker in (("pallas_tpu", "tpu", "tpu_custom_call"), ("pallas_gpu", "cuda", "triton")):
            kernels = attention_backend_for(backend, "gpu" if platform == "cuda" else platform)
            fn = functools.partial(kernels.mla_attention, sm_scale=0.1)
            text = jax.jit(lambda *a, fn=fn: fn(*a[:-1], layer_index=a[-1])).trace(*args).lower(
                lowering_platforms=(platform,)).as_text()
            assert marker in text, (backend, kv_dtype)

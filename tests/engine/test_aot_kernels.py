"""Ahead-of-time compiles of the real kernels for chips this host does not have (vllm_jax.aot).

With libtpu (`pip install 'jax[tpu]'`) and the CUDA plugin (`jax-cuda12-plugin`, `jax-cuda12-pjrt`) at jax's
version, XLA:TPU + Mosaic and XLA:GPU + Triton compile the kernels for compile-only v5e / v6e / H100 / A100
devices and enforce their VMEM, SMEM and shared-memory limits. Each case must compile AND the compiled program
must contain the Pallas kernel (a fallback to XLA ops must not pass). Shapes: Llama-3.1-8B's heads (32 query,
8 KV, head_dim 128) at max_model_len 131072 with max_num_seqs 256: the 256-sequence decode bucket and an
8192-token prefill bucket, bfloat16 and float32, block 16 and 128. Without the plugins these tests are skipped.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from vllm_jax.aot import targets
from vllm_jax.aot.compile import compile_for_target
from vllm_jax.attention import attention_backend_for
from vllm_jax.pallas_kernels.kv_layout import row_lanes

MAX_MODEL_LEN, MAX_NUM_SEQS, Q_HEADS, KV_HEADS, HEAD_DIM, LAYERS, NUM_PAGES = 131072, 256, 32, 8, 128, 2, 4096
BACKEND = {"tpu": "pallas_tpu", "gpu": "pallas_gpu"}
WRITE_KERNELS = {"tpu": (), "gpu": ("vllm_jax_write_kv_cache",)}  # pallas_tpu's write is an XLA scatter
i32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)


def _target(name: str) -> targets.Target:
    reason = targets.available(targets.CHIPS[name.split(":")[0]].platform)
    if reason:
        pytest.skip(reason)
    return targets.get_target(name)


def cache_struct(block_size: int, dtype, kv_heads: int = KV_HEADS, platform: str = "tpu") -> jax.ShapeDtypeStruct:
    """The cache of LAYERS x NUM_PAGES pages: pallas_tpu's lane-dense rows (kv_layout.py), pallas_gpu's heads."""
    if platform == "tpu":
        return jax.ShapeDtypeStruct((LAYERS, NUM_PAGES, block_size, row_lanes(kv_heads, HEAD_DIM)), dtype)
    return jax.ShapeDtypeStruct((LAYERS, NUM_PAGES, block_size, 2 * kv_heads, HEAD_DIM), dtype)


def attention_args(num_tokens: int, num_seqs: int, block_size: int, dtype, kv_heads: int = KV_HEADS, kv_dtype=None,
                   platform: str = "tpu"):
    return (jax.ShapeDtypeStruct((num_tokens, Q_HEADS, HEAD_DIM), dtype),
            cache_struct(block_size, kv_dtype or dtype, kv_heads, platform),
            i32((num_seqs, MAX_MODEL_LEN // block_size)), i32((num_seqs,)), i32((num_seqs + 1,)), i32((1,)), i32(()))


def attention(platform: str):
    def fn(q, cache, tables, lens, qsl, num_seqs, layer):
        return attention_backend_for(BACKEND[platform], platform).attention(
            q, cache, tables, lens, qsl, num_seqs, sm_scale=HEAD_DIM ** -0.5, layer_index=layer)
    return fn


def kv_write(platform: str):
    def fn(cache, k, v, slots, layer):
        return attention_backend_for(BACKEND[platform], platform).write_kv_cache(cache, k, v, slots,
                                                                                  layer_index=layer)
    return fn


BUCKETS = [("decode256", 256, 256), ("prefill8192", 8192, 256)]


@pytest.mark.parametrize("target", ["v5e:1x1", "v6e:1x1", "h100", "a100"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("block_size", [16, 128], ids=["block16", "block128"])
@pytest.mark.parametrize("bucket", BUCKETS, ids=[b[0] for b in BUCKETS])
def test_attention_compiles_with_the_kernel_in_it(target, dtype, block_size, bucket):
    t = _target(target)
    _, num_tokens, num_seqs = bucket
    report = compile_for_target(attention(t.platform), attention_args(num_tokens, num_seqs, block_size, dtype,
                                                                     platform=t.platform), t)
    assert report.ok, report.error
    assert report.kernel_calls == 1 and report.kernel_names == ("vllm_jax_ragged_paged_attention",)
    assert report.kernel_flops > 0 and report.roofline_seconds > 0
    if t.platform == "tpu":  # XLA:TPU's cost analysis counts the kernel's CostEstimate
        assert report.xla_flops >= report.kernel_flops


@pytest.mark.parametrize("target", ["v5e:1x1", "v6e:1x1", "h100"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("num_tokens", [256, 8192])
def test_kv_write_compiles_with_the_kernel_and_updates_the_donated_cache_in_place(target, dtype, num_tokens):
    t = _target(target)
    cache = cache_struct(16, dtype, platform=t.platform)
    k = jax.ShapeDtypeStruct((num_tokens, KV_HEADS, HEAD_DIM), dtype)
    report = compile_for_target(kv_write(t.platform), (cache, k, k, i32((num_tokens,)), i32(())), t,
                                donate_argnums=(0,))
    assert report.ok, report.error
    assert report.kernel_names == WRITE_KERNELS[t.platform]
    cache_bytes = LAYERS * NUM_PAGES * 16 * 2 * KV_HEADS * HEAD_DIM * jnp.dtype(dtype).itemsize  # lane-dense: same
    assert report.memory["alias_size_in_bytes"] >= cache_bytes


@pytest.mark.parametrize("target", ["v5e:1x1", "v6e:1x1", "h100"])
@pytest.mark.parametrize("bucket", BUCKETS, ids=[b[0] for b in BUCKETS])
def test_an_fp8_cache_compiles_with_both_kernels(target, bucket):
    """--kv-cache-dtype fp8 on bfloat16 models: float8_e4m3fn pages, cast to bfloat16 before the dots (v5e has no
    fp8 arithmetic), and the quantizing KV write updating the donated cache in place."""
    t = _target(target)
    _, num_tokens, num_seqs = bucket
    args = attention_args(num_tokens, num_seqs, 16, jnp.bfloat16, kv_dtype=jnp.float8_e4m3fn, platform=t.platform)
    report = compile_for_target(attention(t.platform), args, t)
    assert report.ok, report.error
    assert report.kernel_names == ("vllm_jax_ragged_paged_attention",)
    k = jax.ShapeDtypeStruct((num_tokens, KV_HEADS, HEAD_DIM), jnp.bfloat16)
    report = compile_for_target(kv_write(t.platform), (args[1], k, k, i32((num_tokens,)), i32(())), t,
                                donate_argnums=(0,))
    assert report.ok, report.error
    assert report.kernel_names == WRITE_KERNELS[t.platform]
    assert report.memory["alias_size_in_bytes"] >= LAYERS * NUM_PAGES * 16 * 2 * KV_HEADS * HEAD_DIM


@pytest.mark.parametrize("kv_dtype", [jnp.bfloat16, jnp.float8_e4m3fn], ids=["bf16", "fp8"])
@pytest.mark.parametrize("bucket", BUCKETS, ids=[b[0] for b in BUCKETS])
def test_phi3_head_dim_96_compiles_with_both_gpu_kernels(bucket, kv_dtype):
    """Phi-3-mini's heads (32 query, 32 KV, head_dim 96: not a power of two) on H100: Triton compiles the kernels'
    128-column masked loads of the unpadded [.., 64, 96] cache and the masked KV write, updating it in place."""
    t = _target("h100")
    _, num_tokens, num_seqs = bucket
    heads, head_dim = 32, 96
    cache = jax.ShapeDtypeStruct((LAYERS, NUM_PAGES, 16, 2 * heads, head_dim), kv_dtype)
    q = jax.ShapeDtypeStruct((num_tokens, heads, head_dim), jnp.bfloat16)
    args = (q, cache, i32((num_seqs, MAX_MODEL_LEN // 16)), i32((num_seqs,)), i32((num_seqs + 1,)), i32((1,)), i32(()))
    report = compile_for_target(attention("gpu"), args, t)
    assert report.ok, report.error
    assert report.kernel_names == ("vllm_jax_ragged_paged_attention",)
    report = compile_for_target(kv_write("gpu"), (cache, q, q, i32((num_tokens,)), i32(())), t, donate_argnums=(0,))
    assert report.ok, report.error
    assert report.kernel_names == WRITE_KERNELS["gpu"]
    cache_bytes = LAYERS * NUM_PAGES * 16 * 2 * heads * head_dim * jnp.dtype(kv_dtype).itemsize
    assert report.memory["alias_size_in_bytes"] >= cache_bytes


def test_an_fp8_cache_on_a_gpu_before_compute_capability_8_9_is_refused_naming_the_flags():
    """Triton converts float8_e4m3fn only from sm_89 on: A100 is refused while tracing (at warm-up)."""
    t = _target("a100")
    args = attention_args(256, 256, 16, jnp.bfloat16, kv_dtype=jnp.float8_e4m3fn, platform="gpu")
    report = compile_for_target(attention(t.platform), args, t)
    assert not report.ok and "ValueError: --kv-cache-dtype fp8 with pallas_gpu needs compute capability 8.9" \
        in report.error, report.error


def test_no_gqa_float32_fits_v5e_vmem():
    """32 KV heads, float32, 512 tokens: scoped VMEM 22.95M > 16M on v5e before the per-chip plan."""
    t = _target("v5e:1x1")
    args = attention_args(512, 256, 16, jnp.float32, kv_heads=32)
    args = (args[0], args[1], i32((256, 4096 // 16))) + args[3:]
    report = compile_for_target(attention("tpu"), args, t)
    assert report.ok, report.error
    assert report.kernel_calls == 1


@pytest.mark.parametrize("target, kv_heads, layout", [("v5e:2x2", 8, "sharded"), ("v6e:2x4", 8, "sharded"),
                                                       ("v6e:2x4", 4, "replicated")])
def test_kernels_under_tensor_parallelism_compile_per_device(target, kv_heads, layout):
    """Mosaic calls cannot be partitioned by GSPMD; inside shard_map every device compiles its own kernel."""
    t = _target(target)
    mesh = t.mesh()
    head = P(None, "model", None)
    cache_spec = P(None, None, None, "model") if layout == "sharded" else P()  # lane-dense rows (kv_layout.py)
    args = attention_args(256, 256, 16, jnp.bfloat16, kv_heads=kv_heads)
    shardings = (head, cache_spec, P(), P(), P(), P(), P())
    kernels = attention_backend_for("pallas_tpu", "tpu")

    def attn(q, cache, tables, lens, qsl, num_seqs, layer):
        return kernels.attention(q, cache, tables, lens, qsl, num_seqs, sm_scale=0.088, layer_index=layer,
                                 mesh=mesh)
    report = compile_for_target(attn, args, t, shardings=shardings)
    assert report.ok, report.error
    assert report.kernel_calls == 1

    def write(cache, k, v, slots, layer):
        return kernels.write_kv_cache(cache, k, v, slots, layer_index=layer, mesh=mesh)
    k = jax.ShapeDtypeStruct((256, kv_heads, HEAD_DIM), jnp.bfloat16)
    kv_spec = head if layout == "sharded" else P()
    report = compile_for_target(write, (args[1], k, k, i32((256,)), i32(())), t,
                                shardings=(cache_spec, kv_spec, kv_spec, P(), P()), donate_argnums=(0,))
    assert report.ok, report.error
    assert report.kernel_calls == 0  # an XLA scatter into each device's lane-dense cache (kv_write.py)
    assert report.memory["alias_size_in_bytes"] > 0


def test_the_compile_enforces_the_chips_limits():
    """A kernel over the limit fails here as on the chip: VMEM on v5e, shared memory on H100."""
    t = _target("v5e:1x1")

    def kernel(x_ref, o_ref, big):
        big[...] = jnp.zeros(big.shape, big.dtype)
        o_ref[...] = x_ref[...] + big[0:8, :]

    def too_big(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              scratch_shapes=[pltpu.VMEM((160 * 1024 * 1024 // 512, 128), jnp.float32)])(x)
    report = compile_for_target(too_big, (jax.ShapeDtypeStruct((8, 128), jnp.float32),), t)
    assert not report.ok and "RESOURCE_EXHAUSTED" in report.error

    g = _target("h100")
    roomy = dataclasses.replace(targets.CHIPS["h100"], shared_memory_per_block_optin=1 << 20)

    def whole_pages(q, cache, tables, lens, qsl, num_seqs, layer):  # planned for a chip with 1 MiB per block
        from vllm_jax.pallas_kernels import gpu_attention
        return gpu_attention.ragged_paged_attention_gpu(q, cache, tables, lens, qsl, num_seqs, sm_scale=0.088,
                                                        layer_index=layer, chip=roomy)
    report = compile_for_target(whole_pages, attention_args(8192, 256, 128, jnp.float32, platform="gpu"), g)
    assert not report.ok and "Shared memory size limit exceeded" in report.error


@pytest.mark.parametrize("target", ["v6e:1x1", "cpu"])
def test_tpu_takes_the_logprobs_top_k_lane_wide_and_other_platforms_the_plain_one(target):
    """The sampler's top-K logprobs: a 128-wide TopK cut to K on TPU (a narrower one gets a transposed layout
    that compiles 4x slower, docs/accelerators.md), jax.lax.top_k(K) elsewhere; the platform decides at lowering,
    so a compile-only TPU program must hold the wide one."""
    from vllm_jax.aot.compile import compile_jitted, place
    from vllm_jax.sample.sampler import compute_logprobs

    chip = _target(target) if target != "cpu" else targets.get_target("cpu")
    args = place((jax.ShapeDtypeStruct((16, 4096), jnp.float32), i32((16,))), chip)
    report, compiled = compile_jitted(jax.jit(lambda x, t: compute_logprobs(x, t, 20)), args, chip)
    assert report.ok, report.error
    wide = "f32[16,128]" in compiled.as_text()  # the TopK's (or, at this small vocab, the sort's cut) values
    assert wide == (target != "cpu")

"""The kernels' per-chip budgets (pallas_tpu VMEM/SMEM plan, pallas_gpu shared-memory plan), their cost
estimates, and the code paths those plans open, in interpret mode on CPU:

* pallas_tpu reads the block table through 128-aligned windows DMA'd into SMEM per page block; a table wider
  than one window (here 384 columns) with sliding windows makes the blocks start anywhere in a row, cross
  128-column boundaries and reach the clamped last window;
* pallas_gpu walks a page in several KV chunks when a whole page does not fit the chip's shared memory.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import attention_oracle as oracle
from tests.helpers.ragged_batches import long_batch, make_batch
from vllm_jax.aot.targets import CHIPS, gpu_target_config, spec_for_device_kind
from vllm_jax.pallas_kernels import gpu_attention, tpu_attention, tpu_plan
from vllm_jax.pallas_kernels.kv_layout import from_interleaved

LLAMA3_8B = dict(group=4, num_kv_heads=8)


def _long_batch(seed: int, dtype, window: int | None):
    """tests/helpers/ragged_batches.py's long batch at block_size 4, read from layer 1."""
    *batch, total = long_batch(seed, dtype, block_size=4)
    kwargs = dict(sm_scale=0.125, layer_index=jnp.int32(1),
                  sliding_window=None if window is None else jnp.int32(window))
    return tuple(batch), kwargs, total


@pytest.mark.parametrize("window", [None, 37, 700], ids=["full", "window37", "window700"])
def test_tpu_kernel_reads_wide_block_tables_through_smem_windows(window):
    batch, kwargs, total = _long_batch(1, jnp.float32, window)
    assert batch[2].shape[1] > 256  # padded to 384 columns: windows of 256 at 0, 128, and the clamped 128
    want = oracle.attention(*batch, **kwargs)
    run = functools.partial(tpu_attention.ragged_paged_attention_tpu, interpret=True, tq=16, pages_per_block=8,
                            **kwargs)
    got = np.asarray(jax.jit(run)(batch[0], from_interleaved(batch[1]), *batch[2:]))
    np.testing.assert_allclose(got[:total], want, atol=2e-5, rtol=2e-5)


def test_tpu_kernel_wide_table_under_the_tpu_interpreter():
    """Simulated DMAs (performed at their wait) catch a page id read from a window before its DMA landed."""
    batch, kwargs, total = _long_batch(2, jnp.bfloat16, 300)
    want = oracle.attention(*batch, **kwargs)
    run = functools.partial(tpu_attention.ragged_paged_attention_tpu, interpret=tpu_attention.interpret_params(),
                            tq=16, pages_per_block=16, **kwargs)
    got = np.asarray(jax.jit(run)(batch[0], from_interleaved(batch[1]), *batch[2:]), np.float32)
    np.testing.assert_allclose(got[:total], want, atol=3e-2, rtol=3e-2)


def test_gpu_kernel_splits_pages_that_do_not_fit_shared_memory():
    small = dataclasses.replace(CHIPS["h100"], shared_memory_per_block_optin=40_000)
    plan = gpu_attention.gpu_plan(num_tokens=40, num_seqs=8, group=2, num_kv_heads=2, table_width=4, head_dim=64,
                                  block_size=64, dtype=jnp.float32, chip=small)
    assert (plan.kv_rows, plan.num_stages) == (16, 2) and plan.shared_memory_bytes <= 40_000  # 4 chunks a page
    *batch, total = make_batch("mixed", group=2, head_dim=64, dtype=jnp.float32, block_size=64, layers=None, seed=5)
    kwargs = dict(sm_scale=0.125, sliding_window=jnp.int32(40))
    want = oracle.attention(*batch, **kwargs)
    got = np.asarray(gpu_attention.ragged_paged_attention_gpu(*batch, **kwargs, interpret=True, chip=small,
                                                              num_splits=2))
    np.testing.assert_allclose(got[:total], want, atol=2e-5, rtol=2e-5)


def test_tpu_plan_fits_the_chip_and_sets_a_vmem_limit():
    # 32 query heads, no GQA, float32, 512 tokens: 23 MB of scoped VMEM before (v5e's default limit is 16M).
    for chip in (CHIPS["v5e"], CHIPS["v6e"]):
        plan = tpu_plan.tpu_plan(num_tokens=512, num_seqs=256, group=1, num_kv_heads=32, head_dim=128,
                                      block_size=16, q_dtype=jnp.float32, kv_dtype=jnp.float32, table_width=256,
                                      chip=chip)
        assert plan.vmem_limit_bytes == 96 * 2**20
        assert plan.vmem_estimate_bytes <= plan.vmem_limit_bytes // 2
    llama = tpu_plan.tpu_plan(num_tokens=8192, num_seqs=256, head_dim=128, block_size=16, q_dtype=jnp.bfloat16,
                                   kv_dtype=jnp.bfloat16, table_width=8192, chip=CHIPS["v5e"],
                                   group=4, num_kv_heads=8)
    assert (llama.tq, llama.pages_per_block) == (32, 8)  # the shape rule's choice fits untouched
    assert llama.smem_bytes < 64 * 1024  # no block table in SMEM: windows of 256 entries
    fp8 = tpu_plan.tpu_plan(num_tokens=8192, num_seqs=256, head_dim=128, block_size=16, q_dtype=jnp.bfloat16,
                            kv_dtype=jnp.float8_e4m3fn, table_width=8192, chip=CHIPS["v5e"], **LLAMA3_8B)
    # --kv-cache-dtype fp8: 32 KiB pages, so twice the pages per 512 KiB buffer; in VMEM an 8-bit page's 16 K/V
    # rows pad to the 32-row tiling, which the estimate counts (2 MiB of page buffers, 1 MiB in bfloat16)
    assert (fp8.tq, fp8.pages_per_block) == (32, 16)
    assert llama.vmem_estimate_bytes < fp8.vmem_estimate_bytes <= fp8.vmem_limit_bytes // 2


def test_tpu_plan_shrinks_the_page_block_then_the_tile_before_refusing():
    tight = dataclasses.replace(CHIPS["v5e"], vmem_bytes=24 * 2**20)  # 9 MiB budget
    plan = tpu_plan.tpu_plan(num_tokens=1024, num_seqs=64, group=1, num_kv_heads=32, head_dim=128,
                                  block_size=16, q_dtype=jnp.float32, kv_dtype=jnp.float32, table_width=256,
                                  chip=tight)
    assert plan.pages_per_block == 1 and plan.tq < 128
    assert plan.vmem_estimate_bytes <= 9 * 2**20
    with pytest.raises(ValueError, match="--block-size"):
        tpu_plan.tpu_plan(num_tokens=1024, num_seqs=64, group=1, num_kv_heads=32, head_dim=128,
                               block_size=512, q_dtype=jnp.float32, kv_dtype=jnp.float32, table_width=256,
                               chip=tight)
    with pytest.raises(ValueError, match="--max-num-seqs"):
        tpu_plan.tpu_plan(num_tokens=8192, num_seqs=65536, head_dim=128, block_size=16, q_dtype=jnp.bfloat16,
                               kv_dtype=jnp.bfloat16, table_width=8192, chip=CHIPS["v5e"], **LLAMA3_8B)


def test_gpu_plan_halves_the_kv_chunk_for_large_float32_pages():
    for name, limit in (("h100", 227 * 1024), ("a100", 163 * 1024)):
        plan = gpu_attention.gpu_plan(num_tokens=8192, num_seqs=256, group=4, num_kv_heads=8, table_width=1024,
                                      head_dim=128, block_size=128, dtype=jnp.float32, chip=CHIPS[name])
        assert plan.kv_rows < 128 and plan.shared_memory_bytes <= limit  # 256 KiB for whole pages x 2 stages
    tiny = dataclasses.replace(CHIPS["a100"], shared_memory_per_block_optin=8 * 1024)
    with pytest.raises(ValueError, match="shared memory"):
        gpu_attention.gpu_plan(num_tokens=8192, num_seqs=256, group=4, num_kv_heads=8, table_width=1024,
                               head_dim=128, block_size=128, dtype=jnp.float32, chip=tiny)


def test_gpu_plan_refuses_an_fp8_cache_before_compute_capability_8_9():
    """Triton converts float8_e4m3fn from sm_89 on: an A100 is refused while tracing (warm-up), naming the flags."""
    shapes = dict(num_tokens=256, num_seqs=256, group=4, num_kv_heads=8, table_width=1024, head_dim=128,
                  block_size=16, dtype=jnp.float8_e4m3fn)
    assert gpu_attention.gpu_plan(**shapes, chip=CHIPS["h100"]).kv_rows == 16
    with pytest.raises(ValueError, match=r"--kv-cache-dtype fp8 with pallas_gpu needs compute capability 8.9 .*"
                                         r"a100 has 8.0: use --attention-backend xla"):
        gpu_attention.gpu_plan(**shapes, chip=CHIPS["a100"])


def test_cost_estimates_count_the_bucket_at_full_occupancy():
    q = jax.ShapeDtypeStruct((256, 32, 128), jnp.bfloat16)
    cache = jax.ShapeDtypeStruct((2, 4096, 16, 8 * 256), jnp.bfloat16)  # lane-dense (kv_layout.py)
    i32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)
    fn = functools.partial(tpu_attention.ragged_paged_attention_tpu, sm_scale=0.1, layer_index=1)
    jaxpr = jax.make_jaxpr(fn)(q, cache, i32((256, 8192)), i32((256,)), i32((257,)), i32((1,)))
    (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "pallas_call"]
    cost = eqn.params["cost_estimate"]
    context = 4096 * 16 // 256  # the cache shared by 256 slots: 256 tokens each
    assert cost.flops == 4 * 256 * context * 32 * 128
    kv = 256 * context * 16 * 128 * 2  # every slot's pages once (decode: one tile per sequence)
    assert kv < cost.bytes_accessed <= kv + 2 * 256 * 32 * 128 * 2 + 4 * 4096  # + q and out, + page ids


def test_chip_table_and_gpu_target_config():
    assert spec_for_device_kind("TPU v5 lite").name == "v5e"
    assert spec_for_device_kind("TPU v6 lite").name == "v6e"
    assert spec_for_device_kind("NVIDIA H100 80GB HBM3").name == "h100"
    assert spec_for_device_kind("cpu") is None
    for spec in CHIPS.values():
        assert spec.sources and spec.hbm_bytes and spec.hbm_bytes_per_s and spec.peak_bf16_flops
    text = gpu_target_config(CHIPS["h100"])
    assert "shared_memory_per_block_optin: 232448" in text and "major: 9" in text and "core_count: 132" in text


def test_gpu_plan_takes_fewer_query_rows_for_wide_heads():
    """Prefill programs hold a [rows, head_dim] float32 accumulator in registers: 64 rows up to head_dim 256,
    32 at Gemma 4's 512 (shared memory fits either way on an H100)."""
    shapes = dict(num_tokens=8192, num_seqs=64, group=4, num_kv_heads=2, table_width=512, block_size=16,
                  dtype=jnp.bfloat16, chip=CHIPS["h100"])
    assert gpu_attention.gpu_plan(head_dim=256, **shapes).rows == 64
    wide = gpu_attention.gpu_plan(head_dim=512, **shapes)
    assert wide.rows == 32 and wide.kv_rows == 16 and wide.num_stages == 2
    assert gpu_attention.gpu_plan(head_dim=512, **{**shapes, "num_tokens": 64}).rows == 16  # decode rule kept

"""Every attention backend and KV write against the numpy oracle (tests/helpers/attention_oracle.py), the Pallas
kernels in interpret mode on CPU.

Each attention case is a randomized ragged batch (decode-only, prefill-only or mixed, with query chunks that
start and end inside pages, padding tokens and padding sequence slots) over a paged cache with shuffled pages.
The TPU kernel reads the lane-dense form of the same cache (pallas_kernels/kv_layout.py) and runs under
pltpu.InterpretParams (DMAs happen only at their wait and fresh VMEM is NaN, so a missing wait, a wrong
double-buffer slot or a read of an unfetched row changes the answer) and under the generic interpreter (the
engine's interpret mode); head_dim 64 and 96 take the pair-window path, 128 the split K / V halves. Small tiles and page
blocks are forced in some cases so that tiles split sequences and the prefetch crosses page blocks and
sequences. The GPU kernel runs in the generic interpreter, with several flash-decoding split counts.
Lowering tests check that the kernels lower to Mosaic / Triton IR (the compile itself needs the chip).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import attention_oracle as oracle
from tests.helpers.ragged_batches import make_batch
from vllm_jax.attention import attention_backend_for
from vllm_jax.pallas_kernels import gpu_attention, kv_write, tpu_attention, tpu_plan, xla_attention
from vllm_jax.pallas_kernels.kv_layout import from_interleaved, pair_lanes, to_interleaved

# (id, batch kind, GQA group, head_dim, dtype, sliding window, soft cap, stacked layers, block size)
CASES = [
    ("decode_g1_d64_f32", "decode", 1, 64, jnp.float32, None, None, False, 8),
    ("prefill_g2_d128_f32_window", "prefill", 2, 128, jnp.float32, 5, None, False, 16),
    ("mixed_g4_d64_bf16_softcap_layers", "mixed", 4, 64, jnp.bfloat16, None, 4.0, True, 8),
    ("mixed_g8_d128_f32_window_softcap_layers", "mixed", 8, 128, jnp.float32, 9, 20.0, True, 16),
    ("mixed_g3_d64_bf16_window", "mixed", 3, 64, jnp.bfloat16, 6, None, False, 16),
    ("decode_g4_d128_bf16_layers", "decode", 4, 128, jnp.bfloat16, None, None, True, 8),
]
# head_dim not a multiple of 128 (pallas_tpu's lane-dense cache pads a (K | V) pair to 256 lanes: kv_layout.py)
CASES_96 = [
    ("mixed_g2_d96_f32_window_softcap_layers", "mixed", 2, 96, jnp.float32, 7, 10.0, True, 16),
    ("decode_g4_d96_bf16", "decode", 4, 96, jnp.bfloat16, None, None, False, 16),
]
# head_dim not a power of two for pallas_gpu (Triton blocks are): the kernel computes at padded_head_dim columns
# over masked loads of the unpadded cache. 96 (Phi-3), 24 (pads to 32, a quarter of padding), 48 and 80 (to 64 /
# 128) with small GQA groups; 16-slot pages take the kernel's dot path, 8-slot ones its broadcast-multiply path.
CASES_NPOW2 = CASES_96 + [
    ("prefill_g2_d24_f32_window", "prefill", 2, 24, jnp.float32, 5, None, False, 16),
    ("mixed_g3_d48_bf16_softcap_layers", "mixed", 3, 48, jnp.bfloat16, None, 4.0, True, 8),
    ("decode_g1_d80_f32_layers", "decode", 1, 80, jnp.float32, None, None, True, 8),
]


def _tpu(**kwargs):
    """The TPU kernel over the lane-dense form of a test batch's interleaved cache (kv_layout.from_interleaved)."""
    def run(q, kv_cache, *rest, **call_kwargs):
        return tpu_attention.ragged_paged_attention_tpu(q, from_interleaved(kv_cache), *rest, **kwargs,
                                                        **call_kwargs)
    return run


def _tpu_write(**kwargs):
    """The TPU KV write into the lane-dense form of an interleaved cache, read back interleaved; the padding lanes
    of every pair window (head_dim 96: 64 of 256) must stay zero."""
    def write(kv_cache, k, v, slots, **call_kwargs):
        head_dim = kv_cache.shape[-1]
        rows = kv_write.write_kv_cache_tpu(from_interleaved(kv_cache), k, v, slots, **kwargs, **call_kwargs)
        pairs = np.asarray(rows, np.float32).reshape(*rows.shape[:-1], -1, pair_lanes(head_dim))
        assert not pairs[..., 2 * head_dim:].any()
        return to_interleaved(rows, head_dim)
    return write


def _check(case, run, seed: int) -> None:
    """Run `run(*batch, **kwargs)` and compare the real rows with the oracle; padding rows must be finite."""
    _, kind, group, head_dim, dtype, window, cap, layered, block_size = case
    *batch, total = make_batch(kind, group=group, head_dim=head_dim, dtype=dtype, block_size=block_size,
                               layers=3 if layered else None, seed=seed)
    kwargs = dict(sm_scale=head_dim ** -0.5, soft_cap=cap,
                  sliding_window=None if window is None else jnp.int32(window),
                  layer_index=jnp.int32(1) if layered else None)
    want = oracle.attention(*batch, **kwargs)
    got = np.asarray(jax.jit(functools.partial(run, **kwargs))(*batch), np.float32)
    assert got.shape == batch[0].shape and want.shape[0] == total
    assert np.isfinite(got).all()
    tol = 2e-5 if dtype == jnp.float32 else 3e-2
    np.testing.assert_allclose(got[:total], want, atol=tol, rtol=tol)


# ---- the oracle itself, on a batch small enough to work out by hand -------------------------------------------

def _hand_batch() -> tuple:
    """Sequence A: a 2-token prompt (positions 0, 1) in page 3. Sequence B: one decode row at position 2, its KV in
    pages 1 and 2. Two KV heads of head_dim 1, four query heads (GQA group 2); every cache entry no sequence owns
    is NaN, so reading one shows. sm_scale 0.5 with q = 2 (heads 0, 2) or 4 (heads 1, 3): a score is k or 2k."""
    cache = np.full((4, 2, 4, 1), np.nan)
    cache[3, :, :, 0] = [[0.0, 1.0, 0.0, 10.0],  # A position 0: k0, v0, k1, v1
                         [math.log(3), 5.0, 0.0, 30.0]]  # A position 1
    cache[1, :, :, 0] = [[0.0, 3.0, 0.0, 100.0], [0.0, 6.0, 0.0, 200.0]]  # B positions 0, 1
    cache[2, 0, :, 0] = [math.log(2), 12.0, 0.0, 300.0]  # B position 2
    q = np.tile(np.array([2.0, 4.0, 2.0, 4.0])[None, :, None], (4, 1, 1))  # row 3 is padding
    tables = np.array([[3, 0], [1, 2], [0, 0]], np.int32)
    return q, cache, tables, np.array([2, 3, 0]), np.array([0, 2, 3, 3]), np.array([2])


def test_oracle_on_a_hand_computed_batch():
    """Row 1 (A, position 1) sees scores (0, ln 3) on KV head 0: weights 1:3 on values 1, 5 -> 4 for head 0,
    1:9 -> 4.6 for head 1 (score 2k); KV head 1 has equal scores: the mean of 10, 30. Row 2 (B, position 2) sees
    (0, 0, ln 2): weights 1:1:2 on 3, 6, 12 -> 8.25, 1:1:4 -> 9.5; with window 2 only positions 1, 2."""
    batch = _hand_batch()
    want = np.array([[1, 1, 10, 10], [4, 4.6, 20, 20], [8.25, 9.5, 200, 200]])
    np.testing.assert_allclose(oracle.attention(*batch, sm_scale=0.5)[..., 0], want, rtol=1e-12)
    windowed = np.array([[1, 1, 10, 10], [4, 4.6, 20, 20], [10, 10.8, 250, 250]])  # (6 + 24) / 3, (6 + 48) / 5
    np.testing.assert_allclose(oracle.attention(*batch, sm_scale=0.5, sliding_window=2)[..., 0], windowed,
                               rtol=1e-12)
    e = math.exp  # soft cap 1: tanh(ln 3) = 0.8, tanh(2 ln 3) = 80/82, tanh(ln 2) = 0.6, tanh(2 ln 2) = 15/17
    capped = np.array([[1, 1, 10, 10],
                       [(1 + 5 * e(0.8)) / (1 + e(0.8)), (1 + 5 * e(80 / 82)) / (1 + e(80 / 82)), 20, 20],
                       [(9 + 12 * e(0.6)) / (2 + e(0.6)), (9 + 12 * e(15 / 17)) / (2 + e(15 / 17)), 200, 200]])
    np.testing.assert_allclose(oracle.attention(*batch, sm_scale=0.5, soft_cap=1.0)[..., 0], capped, rtol=1e-12)


def test_oracle_kv_write_on_a_hand_computed_case():
    cache = np.zeros((2, 3, 2, 4, 1), np.float32)  # 2 layers, 3 pages of 2 slots, 2 KV heads, head_dim 1
    k = np.array([[[1.0], [2.0]], [[5.0], [6.0]]])
    v = np.array([[[3.0], [4.0]], [[7.0], [8.0]]])
    got = oracle.write_kv(cache, k, v, np.array([3, 4]), layer_index=1)
    want = np.zeros_like(cache)
    want[1, 1, 1, :, 0] = [1, 3, 2, 4]  # slot 3: page 1, offset 1; k0, v0, k1, v1
    want[1, 2, 0, :, 0] = [5, 7, 6, 8]  # slot 4: page 2, offset 0
    np.testing.assert_array_equal(got, want)
    assert not cache.any()  # the input is not written


# ---- the backends against the oracle --------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES + CASES_96, ids=[c[0] for c in CASES + CASES_96])
def test_tpu_kernel_under_tpu_interpreter_matches_the_oracle(case):
    small = (CASES + CASES_96).index(case) % 2 == 0  # force 16-token tiles and 2-page blocks in every other case
    run = _tpu(interpret=tpu_attention.interpret_params(), tq=16 if small else None,
               pages_per_block=2 if small else None)
    _check(case, run, seed=(CASES + CASES_96).index(case))


@pytest.mark.parametrize("case", [CASES[2], CASES_96[0]], ids=[CASES[2][0], CASES_96[0][0]])
def test_tpu_kernel_under_the_generic_interpreter_matches_the_oracle(case):
    """The path the engine's interpret mode takes (inside the jitted, scanned model step)."""
    _check(case, _tpu(interpret=True, tq=16, pages_per_block=2), seed=10 + CASES.index(case) if case in CASES else 13)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gpu_kernel_matches_the_oracle(case):
    splits = (None, 1, 3)[CASES.index(case) % 3]  # default rule, no split, uneven split
    run = functools.partial(gpu_attention.ragged_paged_attention_gpu, interpret=True, num_splits=splits)
    _check(case, run, seed=20 + CASES.index(case))


@pytest.mark.parametrize("case", CASES_NPOW2, ids=[c[0] for c in CASES_NPOW2])
def test_gpu_kernel_with_a_head_dim_not_a_power_of_two_matches_the_oracle(case):
    """The interpreter fills a load's columns past the array with NaN unless the mask supplies zeros, so a padded
    read without its mask fails here (checked by dropping it). Whether Triton's addresses stay inside a row is
    for the chip: the compile-check proves only that the masked load compiles."""
    splits = (None, 3)[CASES_NPOW2.index(case) % 2]
    run = functools.partial(gpu_attention.ragged_paged_attention_gpu, interpret=True, num_splits=splits)
    _check(case, run, seed=80 + CASES_NPOW2.index(case))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_xla_backend_matches_the_oracle(case):
    """The CPU backend works in tiles of query rows: with 4-row tiles the in-step keys span several tiles, tiles
    split the prefill chunks, and the last tile of a sequence is clamped back inside the bucket."""
    tile = (4, 64)[CASES.index(case) % 2]

    def run(q, *batch, **kwargs):  # rows padded to a whole number of tiles, as the engine's buckets are
        padded = jnp.pad(q, ((0, -q.shape[0] % tile), (0, 0), (0, 0)))
        return xla_attention.ragged_paged_attention(padded, *batch, query_tile=tile, **kwargs)[:q.shape[0]]

    _check(case, run, seed=40 + CASES.index(case))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="interpret mode is the CPU's (device_check runs this file "
                    "on a GPU, where each backend runs natively or is refused)")
@pytest.mark.parametrize("backend", ["pallas_tpu", "pallas_gpu"])
def test_dispatch_runs_the_named_kernel_in_interpret_mode_on_cpu(backend, monkeypatch):
    called = []
    chosen = type(attention_backend_for(backend))
    real = chosen.attention_kernel
    assert real is (tpu_attention.ragged_paged_attention_tpu if backend == "pallas_tpu"
                    else gpu_attention.ragged_paged_attention_gpu)
    monkeypatch.setattr(chosen, "attention_kernel",
                        staticmethod(lambda *a, **k: called.append(k["interpret"]) or real(*a, **k)))
    lane_dense = from_interleaved if backend == "pallas_tpu" else (lambda c: c)  # pallas_tpu's cache layout

    def run(q, kv_cache, *rest, **kwargs):
        return attention_backend_for(backend).attention(q, lane_dense(kv_cache), *rest, **kwargs)
    _check(CASES[3], run, seed=30)
    assert called == [True]


@pytest.mark.parametrize("layered", [False, True], ids=["one_layer", "layer_stack"])
@pytest.mark.parametrize("write", ["xla", "tpu_interpreter", "tpu_generic", "tpu_generic_d96", "gpu", "gpu_d96",
                                   "gpu_d48_2heads"])
def test_kv_write_equals_the_oracle(write, layered):
    """gpu_d96 / gpu_d48_2heads: masked stores of rows padded to 128 / 64 columns, row by row (6 K/V rows per
    token) and as one [4, 64] block (2 KV heads); the cache's columns are written exactly, nothing past them."""
    rng = np.random.default_rng(40)
    head_dim = 96 if write.endswith("d96") else 48 if "d48" in write else 64
    num_kv_heads, block_size, num_tokens = 2 if write.endswith("2heads") else 3, 8, 21
    shape = ((2,) if layered else ()) + (12, block_size, 2 * num_kv_heads, head_dim)
    cache = jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
    real = rng.choice(np.arange(block_size, 12 * block_size), num_tokens - 4, replace=False)
    slots = jnp.asarray(np.concatenate([real, [0, 1, 2, 3]]), jnp.int32)  # padding tokens -> null block
    k, v = (jnp.asarray(rng.standard_normal((num_tokens, num_kv_heads, head_dim)), jnp.float32) for _ in "kv")
    layer = jnp.int32(1) if layered else None
    fn = {"xla": attention_backend_for("xla").write_kv_cache,
          "tpu_interpreter": _tpu_write(interpret=tpu_attention.interpret_params()),
          "tpu_generic": _tpu_write(interpret=True),
          "gpu": functools.partial(kv_write.write_kv_cache_gpu, interpret=True)}[write.split("_d")[0]]
    got = fn(cache, k, v, slots, layer_index=layer)
    want = oracle.write_kv(cache, k, v, slots, layer_index=layer)
    assert got.shape == cache.shape and got.dtype == cache.dtype
    assert not np.array_equal(want, np.asarray(cache))  # the write changed the cache
    np.testing.assert_array_equal(np.asarray(got, np.float32), want.astype(np.float32))


def test_kv_write_kernels_alias_the_cache_so_a_donated_cache_is_updated_in_place():
    for fn, shape in ((kv_write.write_kv_cache_gpu, (2, 8, 8, 4, 64)),):  # TPU: an XLA scatter (kv_write.py)
        cache = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
        k = jax.ShapeDtypeStruct((16, 2, 64), jnp.bfloat16)
        jaxpr = jax.make_jaxpr(functools.partial(fn, layer_index=1))(cache, k, k, jnp.zeros(16, jnp.int32))
        (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "pallas_call"]
        assert eqn.params["input_output_aliases"] == ((3, 0),)


def _lower(fn, platform: str, *args, static: dict, **traced) -> str:
    """StableHLO text of `fn(*args, **traced, **static)` lowered for `platform` (abstract arguments only)."""
    def call(args, traced):
        return fn(*args, **traced, **static)
    return jax.jit(call).trace(args, traced).lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kernels_lower_to_mosaic_and_triton_for_llama3_8b_heads(dtype):
    q = jax.ShapeDtypeStruct((64, 32, 128), dtype)
    cache = jax.ShapeDtypeStruct((2, 32, 16, 16, 128), dtype)
    tpu_cache = jax.ShapeDtypeStruct((2, 32, 16, 8 * 256), dtype)  # lane-dense (kv_layout.py)
    i32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)
    rest = (i32((8, 16)), i32((8,)), i32((9,)), i32((1,)))
    static = dict(sm_scale=0.1, soft_cap=30.0)
    for fn, platform, marker, c in ((tpu_attention.ragged_paged_attention_tpu, "tpu", "tpu_custom_call", tpu_cache),
                                    (gpu_attention.ragged_paged_attention_gpu, "cuda", "triton", cache)):
        text = _lower(fn, platform, q, c, *rest, static=static, sliding_window=i32(()), layer_index=i32(()))
        assert marker in text
    k = jax.ShapeDtypeStruct((64, 8, 128), dtype)
    assert "triton" in _lower(kv_write.write_kv_cache_gpu, "cuda", cache, k, k, i32((64,)), static={},
                              layer_index=i32(()))
    # pallas_tpu writes its lane-dense cache with an XLA scatter (a Mosaic DMA cannot start inside a tile)
    text = _lower(kv_write.write_kv_cache_tpu, "tpu", tpu_cache, k, k, i32((64,)), static={}, layer_index=i32(()))
    assert "scatter" in text and "tpu_custom_call" not in text


def test_tpu_block_sizes_follow_the_shapes_not_a_chip_table():
    tq, pages = tpu_plan.tpu_block_sizes(num_tokens=256, group=4, num_kv_heads=8, head_dim=128, block_size=16,
                                              kv_dtype=jnp.bfloat16, max_blocks_per_seq=512)
    assert (tq, pages) == (32, 8)  # 128 query rows; 8 pages of 64 KiB fill a 512 KiB buffer
    tq, pages = tpu_plan.tpu_block_sizes(num_tokens=256, group=4, num_kv_heads=8, head_dim=128, block_size=32,
                                              kv_dtype=jnp.float32, max_blocks_per_seq=512)
    assert (tq, pages) == (32, 2)
    tq, pages = tpu_plan.tpu_block_sizes(num_tokens=5, group=1, num_kv_heads=1, head_dim=64, block_size=8,
                                              kv_dtype=jnp.float32, max_blocks_per_seq=3)
    assert (tq, pages) == (16, 3)  # never past the padded batch or the table width


def test_gpu_splits_kv_for_small_decode_batches_only():
    _, few = gpu_attention.gpu_block_sizes(num_tokens=16, num_seqs=8, group=4, num_kv_heads=8, table_width=512)
    _, many = gpu_attention.gpu_block_sizes(num_tokens=8192, num_seqs=256, group=4, num_kv_heads=8,
                                            table_width=512)
    assert few > 1 and many == 1


def test_auto_backend_picks_the_platform_kernel():
    assert attention_backend_for("auto", "tpu").name == "pallas_tpu"
    assert attention_backend_for("auto", "gpu").name == "pallas_gpu"
    assert attention_backend_for("auto", "cpu").name == "xla"
    assert attention_backend_for("pallas_tpu", "cpu").name == "pallas_tpu"  # interpret mode


def test_unknown_or_foreign_backend_names_are_clear_errors():
    with pytest.raises(ValueError, match="must be one of"):
        attention_backend_for("flash", "cpu")
    with pytest.raises(ValueError, match="does not run on gpu"):
        attention_backend_for("pallas_tpu", "gpu")
    with pytest.raises(ValueError, match="does not run on tpu"):
        attention_backend_for("pallas_gpu", "tpu")


# ---- attention sinks (gpt-oss: a learned per-head logit in the softmax denominator) -----------------------------

def test_oracle_sinks_on_the_hand_computed_batch():
    """A sink s adds e^s to the denominator only: row 0 (one key, value 1 on KV head 0) with sink ln 3 on head 0
    gives 1 * 1 / (1 + 3) = 0.25; a sink of -inf-ish changes nothing; row 2, head 1: weights 1:1:4 -> 3 + 6 + 48
    over 6 + e^0 = 57 / 7."""
    batch = _hand_batch()
    sinks = np.array([math.log(3), 0.0, -1e4, -1e4])
    got = oracle.attention(*batch, sm_scale=0.5, sinks=sinks)[..., 0]
    np.testing.assert_allclose(got[0], [0.25, 0.5, 10, 10], rtol=1e-12)
    np.testing.assert_allclose(got[2, 1], 57 / 7, rtol=1e-12)
    np.testing.assert_allclose(got[:, 2:], oracle.attention(*batch, sm_scale=0.5)[:, 2:, 0], rtol=1e-12)


SINK_CASES = [CASES[3], CASES[2]]  # f32 GQA 8 with window, cap and layers; bf16 GQA 4 with cap and layers
SINK_RUNS = {
    "xla": functools.partial(xla_attention.ragged_paged_attention, query_tile=4),
    "tpu_interpreter": _tpu(interpret=tpu_attention.interpret_params(), tq=16, pages_per_block=2),
    "tpu_generic": _tpu(interpret=True, tq=16, pages_per_block=2),
    "gpu": functools.partial(gpu_attention.ragged_paged_attention_gpu, interpret=True, num_splits=3),
    "dispatch_gpu": attention_backend_for("pallas_gpu").attention,
}


@pytest.mark.parametrize("case", SINK_CASES, ids=[c[0] for c in SINK_CASES])
@pytest.mark.parametrize("backend", list(SINK_RUNS))
def test_attention_sinks_every_backend_matches_the_oracle(backend, case):
    """Sinks ~ N(0, 2) per query head: some outweigh every key of a row, some barely count, so a sink taken per
    KV head instead of per query head, scaled by sm_scale, or added to the numerator fails."""
    _, kind, group, head_dim, dtype, window, cap, layered, block_size = case
    *batch, total = make_batch(kind, group=group, head_dim=head_dim, dtype=dtype, block_size=block_size,
                               layers=3 if layered else None, seed=60 + SINK_CASES.index(case))
    sinks = jnp.asarray(np.random.default_rng(61).normal(0.0, 2.0, batch[0].shape[1]), jnp.float32)
    kwargs = dict(sm_scale=head_dim ** -0.5, soft_cap=cap, sliding_window=None if window is None else jnp.int32(window),
                  layer_index=jnp.int32(1) if layered else None)
    q = batch[0]
    if backend == "xla":  # the xla backend takes rows padded to whole query tiles, as the engine's buckets are
        batch[0] = jnp.pad(q, ((0, -q.shape[0] % 4), (0, 0), (0, 0)))
    got = np.asarray(jax.jit(functools.partial(SINK_RUNS[backend], **kwargs))(*batch, sinks=sinks), np.float32)
    got = got[:q.shape[0]]
    want = oracle.attention(q, *batch[1:], **kwargs, sinks=sinks)
    no_sinks = oracle.attention(q, *batch[1:], **kwargs)
    assert np.isfinite(got).all()
    tol = 2e-5 if dtype == jnp.float32 else 3e-2
    np.testing.assert_allclose(got[:total], want, atol=tol, rtol=tol)
    assert np.abs(want - no_sinks).max() > 10 * tol  # the sinks matter at this tolerance


def test_kernels_with_sinks_lower_to_mosaic_and_triton():
    q = jax.ShapeDtypeStruct((64, 32, 128), jnp.bfloat16)
    cache = jax.ShapeDtypeStruct((2, 32, 16, 16, 128), jnp.bfloat16)
    tpu_cache = jax.ShapeDtypeStruct((2, 32, 16, 8 * 256), jnp.bfloat16)
    i32 = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.int32)
    rest = (i32((8, 16)), i32((8,)), i32((9,)), i32((1,)))
    for fn, platform, marker, c in ((tpu_attention.ragged_paged_attention_tpu, "tpu", "tpu_custom_call", tpu_cache),
                                    (gpu_attention.ragged_paged_attention_gpu, "cuda", "triton", cache)):
        text = _lower(fn, platform, q, c, *rest, static=dict(sm_scale=0.1), sliding_window=i32(()), layer_index=i32(()),
                      sinks=jax.ShapeDtypeStruct((32,), jnp.float32))
        assert marker in text


def test_sinks_of_the_wrong_shape_are_a_clear_error():
    *batch, _ = make_batch("decode", group=2, head_dim=64, dtype=jnp.float32, block_size=8, layers=None, seed=1)
    with pytest.raises(ValueError, match="sinks must be"):
        attention_backend_for("xla").attention(*batch, sm_scale=0.1, sinks=jnp.zeros(3))


# ---- fp8 KV cache (--kv-cache-dtype fp8: pallas_kernels/kv_quant.py) -------------------------------------------

FP8 = jnp.float8_e4m3fn
K_SCALE, V_SCALE = 0.5, 2.0  # not 1.0, so a backend that drops a scale fails; powers of two, so K / scale is exact
# Two tiny ragged batches: float32 queries (the CPU model dtype) with a window and stacked layers, and bfloat16
# queries with GQA and a soft cap (the accelerators' dtype: the TPU kernel's fp8 -> float32 -> bfloat16 cast).
FP8_CASES = [CASES[3], CASES[2]]
# The fp8 cache against a float32 cache of the same K/V (values ~ N(0, 1)), xla backend. e4m3 keeps 3 mantissa
# bits: round-to-nearest errs by at most 2^-4 relative per element, and for a value of magnitude ~1 the error is
# about uniform on +-2^-4, RMS 2^-3 / sqrt(12) = 0.036. An output row is a softmax average of V rows with scores
# perturbed by K's errors: measured over 18 batches (3 kinds x 6 seeds), RMS error <= 0.021 and max abs error
# <= 0.167 (the outputs reach 4.6). Bounds: RMS below one unit element's rounding RMS, max abs below one
# worst-case rounding (2^-4) of a |v| = 4 value. Dropping either scale gives max errors of 0.5 to 2.3.
FP8_RMS_BOUND, FP8_MAX_BOUND = 2.0 ** -3 / math.sqrt(12), 4 * 2.0 ** -4


def _fp8_cache(kv: jax.Array, k_scale: float = K_SCALE, v_scale: float = V_SCALE) -> jax.Array:
    """K / k_scale and V / v_scale (interleaved on the head axis) rounded to e4m3, saturated at +-448."""
    scale = np.tile([k_scale, v_scale], kv.shape[-2] // 2)[:, None]
    return jnp.asarray(np.clip(np.asarray(kv, np.float32) / scale, -448, 448).astype(FP8))


def _fp8_batch(case, seed: int) -> tuple[list, dict, int, jax.Array]:
    """(batch over an fp8 cache, kwargs without the scales, real rows, the float32 cache it was rounded from) of a
    CASES entry."""
    _, kind, group, head_dim, dtype, window, cap, layered, block_size = case
    q, kv, *rest, total = make_batch(kind, group=group, head_dim=head_dim, dtype=jnp.float32, block_size=block_size,
                                     layers=3 if layered else None, seed=seed)
    kwargs = dict(sm_scale=head_dim ** -0.5, soft_cap=cap, sliding_window=None if window is None else jnp.int32(window),
                  layer_index=jnp.int32(1) if layered else None)
    return [q.astype(dtype), _fp8_cache(kv), *rest], kwargs, total, kv


def _dequantized(cache: jax.Array) -> np.ndarray:
    scale = np.tile([K_SCALE, V_SCALE], cache.shape[-2] // 2)[:, None]
    return np.asarray(cache, np.float32) * scale


@functools.cache
def _fp8_xla(case_index: int) -> tuple[list, dict, int, np.ndarray]:
    """FP8_CASES[case_index]'s batch, kwargs (with the scales), real rows and the xla backend's output, computed
    once for every backend it is compared with."""
    batch, kwargs, total, _ = _fp8_batch(FP8_CASES[case_index], seed=50 + case_index)
    kwargs.update(k_scale=K_SCALE, v_scale=V_SCALE)
    return batch, kwargs, total, np.asarray(jax.jit(functools.partial(xla_attention.ragged_paged_attention,
                                                                      **kwargs))(*batch), np.float32)


@pytest.mark.parametrize("case", FP8_CASES, ids=[c[0] for c in FP8_CASES])
@pytest.mark.parametrize("backend", ["xla", "tpu_interpreter", "gpu"])
def test_fp8_cache_every_backend_equals_the_xla_backend(backend, case):
    """Each backend reads the same fp8 cache as the xla backend does; the xla backend itself equals the oracle on
    the dequantized cache (fp8 values times their scale, in float64). The TPU kernel runs under InterpretParams
    over the lane-dense form of the cache."""
    batch, kwargs, total, want = _fp8_xla(FP8_CASES.index(case))
    tol = 2e-5 if case[4] == jnp.float32 else 3e-2
    if backend == "xla":
        oracle_kwargs = {k: v for k, v in kwargs.items() if k not in ("k_scale", "v_scale")}
        np.testing.assert_allclose(want[:total], oracle.attention(batch[0], _dequantized(batch[1]), *batch[2:],
                                                                  **oracle_kwargs), atol=tol, rtol=tol)
        return
    run = {"tpu_interpreter": _tpu(interpret=tpu_attention.interpret_params(), tq=16, pages_per_block=2),
           "gpu": functools.partial(gpu_attention.ragged_paged_attention_gpu, interpret=True, num_splits=3)}[backend]
    got = np.asarray(jax.jit(functools.partial(run, **kwargs))(*batch), np.float32)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[:total], want[:total], atol=tol, rtol=tol)


def test_fp8_cache_stays_within_the_e4m3_bound_of_a_float32_cache():
    """See FP8_RMS_BOUND: the xla backend over the fp8 cache against the same K/V in float32 (a mixed batch with
    a window, a soft cap and stacked layers). The fp8 cache's values read with either scale left at 1.0 (as a
    float32 cache, so the float32 program is reused) must break the bound: it can catch a dropped scale."""
    batch, kwargs, total, float_cache = _fp8_batch(CASES[3], seed=60)

    programs = {}

    def run(cache, **scales):
        key = tuple(sorted(scales.items()))
        if key not in programs:
            programs[key] = jax.jit(functools.partial(xla_attention.ragged_paged_attention, **kwargs, **scales))
        return np.asarray(programs[key](batch[0], cache, *batch[2:]), np.float32)[:total]

    want = run(float_cache)

    def errors(got):
        return np.sqrt(np.mean((got - want) ** 2)), np.abs(got - want).max()

    rms, worst = errors(run(batch[1], k_scale=K_SCALE, v_scale=V_SCALE))
    assert 0 < rms < FP8_RMS_BOUND and worst < FP8_MAX_BOUND, (rms, worst)
    for wrong in ((1.0, V_SCALE), (K_SCALE, 1.0)):
        scale = np.tile(wrong, batch[1].shape[-2] // 2)[:, None]
        rms, worst = errors(run(jnp.asarray(np.asarray(batch[1], np.float32) * scale)))
        assert rms > FP8_RMS_BOUND and worst > FP8_MAX_BOUND, (wrong, rms, worst)


@pytest.mark.parametrize("write", ["xla", "tpu_interpreter", "tpu_generic", "gpu"])
def test_fp8_kv_write_stores_the_e4m3_rounding_of_k_over_its_scale(write):
    """Read back times its scale, every written row is e4m3(K / k_scale) * k_scale (ml_dtypes' round to nearest
    even), saturated at +-448 * scale; the rows not written are untouched."""
    import ml_dtypes

    rng = np.random.default_rng(41)
    num_kv_heads, head_dim, block_size, num_tokens = 2, 64, 8, 13
    cache = jnp.asarray(rng.standard_normal((2, 10, block_size, 2 * num_kv_heads, head_dim)), FP8)
    slots = jnp.asarray(np.concatenate([rng.choice(np.arange(block_size, 10 * block_size), num_tokens - 3,
                                                   replace=False), [0, 1, 2]]), jnp.int32)
    k, v = (rng.standard_normal((num_tokens, num_kv_heads, head_dim)).astype(np.float32) * 3 for _ in "kv")
    k[0, 0, :4] = [1000.0, -1000.0, 3 * 2.0 ** -10, -3e-3]  # saturate to +-448 * K_SCALE; subnormals
    fn = {"xla": attention_backend_for("xla").write_kv_cache,
          "tpu_interpreter": _tpu_write(interpret=tpu_attention.interpret_params()),
          "tpu_generic": _tpu_write(interpret=True),
          "gpu": functools.partial(kv_write.write_kv_cache_gpu, interpret=True)}[write]
    got = fn(cache, jnp.asarray(k), jnp.asarray(v), slots, layer_index=1, k_scale=K_SCALE, v_scale=V_SCALE)
    assert got.dtype == FP8

    def e4m3(x, scale):
        return np.clip(x / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)

    want = oracle.write_kv(np.asarray(cache, np.float32), e4m3(k, K_SCALE), e4m3(v, V_SCALE), slots, layer_index=1)
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)
    read_back = np.asarray(got, np.float32)[1, slots[0] // block_size, slots[0] % block_size, 0] * K_SCALE
    assert read_back[:4].tolist() == [448 * K_SCALE, -448 * K_SCALE, 3 * 2.0 ** -10, -3 * 2.0 ** -10]


@pytest.mark.parametrize("kernel", ["tpu", "gpu"])
def test_kernels_head_dim_96_with_an_fp8_cache_and_sinks_match_the_oracle(kernel):
    """Phi-3's head_dim (TPU: a 256-lane pair window holding 192 lanes of K | V; GPU: masked 128-column loads)
    with everything at once: an fp8 cache with both scales, attention sinks, a window and a soft cap, stacked
    layers, GQA 2, against the oracle on the dequantized cache."""
    case = CASES_96[0]
    batch, kwargs, total, _ = _fp8_batch(case, seed=70)
    sinks = jnp.asarray(np.random.default_rng(71).normal(0.0, 2.0, batch[0].shape[1]), jnp.float32)
    run = (_tpu(interpret=tpu_attention.interpret_params(), tq=16, pages_per_block=2) if kernel == "tpu" else
           functools.partial(gpu_attention.ragged_paged_attention_gpu, interpret=True, num_splits=2))
    got = np.asarray(jax.jit(functools.partial(run, **kwargs, k_scale=K_SCALE, v_scale=V_SCALE))(*batch, sinks=sinks),
                     np.float32)
    want = oracle.attention(batch[0], _dequantized(batch[1]), *batch[2:], **kwargs, sinks=sinks)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[:total], want, atol=2e-5, rtol=2e-5)

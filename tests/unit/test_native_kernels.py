"""The native CPU kernels (vllm_jax/native/): x @ W and x @ E^T against weights kept in GGUF blocks read directly
(docs/architecture/06-model.md, "Quantized weights"), x @ E^T against a float32 table read in place, and ragged
paged attention for small steps
(docs/architecture/07-attention.md, "Attention kernels"), C++ XLA FFI handlers.

Bounds: both kernels compute in float32 what XLA's path computes from the dequantized weight, in another order of
summation, so they must equal x @ dequantize_grouped(...) in float64 to float32 rounding (rtol 1e-5 of the largest
output), for every kept format, for row counts that cover each row block (1, 2, 4 and the remainders), for widths
that leave a partial tile, and for a matrix big enough to be split across threads. A kernel that dropped a group,
a nibble or a min would miss by orders of magnitude more. The paged attention kernel must equal the xla backend's
attention to float32 rounding (2e-6 of the largest output) on every live row, with sliding windows, soft caps,
sinks, grouped query heads and a head_dim off the vector width; a wrong key range or scale would miss by far more.
"""

from __future__ import annotations

import logging
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vllm_jax.model.grouped_quant import dequantize_grouped, grouped_shapes
from vllm_jax.model.quantized_dots import dot_rows, float_dot_rows, float_dots, gguf_dot, gguf_dot_rows, gguf_dots
from vllm_jax.model.step_inputs import real_logits_rows
from vllm_jax.native import build, float_head, float_matvec, gguf_matvec

FORMATS = ("q8_0", "q4_0", "q4_1", "q4_k", "q6_k")
HAVE_COMPILER = any(shutil.which(c) for c in ("c++", "g++", "clang++"))
needs_compiler = pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler: the XLA path is used")


def _kept(shape: tuple[int, int], fmt: str, axis: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random kept blocks of a weight of float `shape` (all byte values, signed scales and mins)."""
    rng = np.random.default_rng(seed)
    parts = {}
    for part, (part_shape, dtype) in grouped_shapes(shape, fmt, axis).items():
        if part == "values":
            parts[part] = (rng.integers(0, 256, part_shape).astype(np.uint8) if dtype == np.uint8
                           else rng.integers(-128, 128, part_shape).astype(np.int8))
        else:
            parts[part] = ((rng.random(part_shape) - 0.5) * 0.1).astype(dtype)
    return parts


def _program_calls_native(fn, *args) -> bool:
    return "vllm_jax_gguf_" in jax.jit(fn).lower(*args).as_text()


@needs_compiler
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 7])
def test_linear_kernel_equals_x_times_the_dequantized_weight(fmt, rows):
    """W [in, out] grouped along in; out = 200 leaves a partial 64-column tile."""
    assert gguf_matvec.available(), "a C++ compiler is here, so the kernel must build"
    parts = _kept((256, 200), fmt, axis=-2)
    x = np.random.default_rng(1).standard_normal((rows, 256)).astype(np.float32)
    args = (jnp.asarray(x), parts["values"], parts["scale"], parts.get("min"))
    dot = jax.tree_util.Partial(gguf_dot, fmt=fmt)
    assert _program_calls_native(dot, *args)
    want = x.astype(np.float64) @ dequantize_grouped(parts["values"], parts["scale"], parts.get("min"), fmt,
                                                     axis=-2).astype(np.float64)
    got = np.asarray(jax.jit(dot)(*args))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@needs_compiler
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 5])
def test_table_kernel_equals_x_times_the_dequantized_table(fmt, rows):
    """E [vocab, hidden] grouped along hidden (the tied LM head); vocab 300 leaves a partial 128-row unit."""
    parts = _kept((300, 256), fmt, axis=-1, seed=2)
    x = np.random.default_rng(3).standard_normal((rows, 256)).astype(np.float32)
    args = (jnp.asarray(x), parts["values"], parts["scale"], parts.get("min"))
    dot = jax.tree_util.Partial(gguf_dot_rows, fmt=fmt, chunk_rows=None)
    assert _program_calls_native(dot, *args)
    table = dequantize_grouped(parts["values"], parts["scale"], parts.get("min"), fmt, axis=-1)
    want = x.astype(np.float64) @ table.astype(np.float64).T
    np.testing.assert_allclose(np.asarray(jax.jit(dot)(*args)), want, rtol=0, atol=1e-5 * np.abs(want).max())


@needs_compiler
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_a_matrix_split_across_threads_equals_the_reference(fmt):
    """Above kParallelWeights (2^15) the column tiles are shared with XLA's thread pool."""
    parts = _kept((1024, 576), fmt, axis=-2, seed=4)
    x = np.random.default_rng(5).standard_normal((4, 1024)).astype(np.float32)
    want = x.astype(np.float64) @ dequantize_grouped(parts["values"], parts["scale"], parts.get("min"), fmt,
                                                     axis=-2).astype(np.float64)
    for _ in range(3):  # the helper tasks start at different times each call
        got = np.asarray(jax.jit(gguf_dot, static_argnums=4)(jnp.asarray(x), parts["values"], parts["scale"],
                                                             parts.get("min"), fmt))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@needs_compiler
def test_several_weights_in_one_call_equal_each_alone():
    """q / k / v (or gate / up) share x: one native call computes every weight's product, formats and widths mixed."""
    weights = [(_kept((256, n), fmt, axis=-2, seed=n), fmt) for n, fmt in ((200, "q4_1"), (64, "q8_0"), (96, "q4_k"))]
    x = np.random.default_rng(7).standard_normal((3, 256)).astype(np.float32)
    kept = [(p["values"], p["scale"], p.get("min"), fmt) for p, fmt in weights]
    hlo = jax.jit(lambda x: gguf_dots(x, kept)).lower(jnp.asarray(x)).as_text()
    assert hlo.count("custom_call @vllm_jax_gguf_matvec(") == 1
    for got, (values, scale, minimum, fmt) in zip(jax.jit(lambda x: gguf_dots(x, kept))(jnp.asarray(x)), kept):
        want = x.astype(np.float64) @ dequantize_grouped(values, scale, minimum, fmt, axis=-2).astype(np.float64)
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-5 * np.abs(want).max())


@needs_compiler
def test_a_buckets_padding_rows_are_skipped():
    """Inside `padded_rows` (a forward's layers) only the first `valid` rows are computed; the padding's outputs are
    zeros, and a dot of another row count is untouched."""
    parts = _kept((256, 200), "q4_1", axis=-2)
    w = dequantize_grouped(parts["values"], parts["scale"], parts["min"], "q4_1", axis=-2).astype(np.float64)
    x = np.random.default_rng(6).standard_normal((8, 256)).astype(np.float32)

    def padded(x, valid):
        with gguf_matvec.padded_rows(8, valid):
            inside = gguf_dot(x, parts["values"], parts["scale"], parts["min"], "q4_1")
            other = gguf_dot(x[:4], parts["values"], parts["scale"], parts["min"], "q4_1")
        return inside, other

    for valid in (1, 5, 8):
        inside, other = map(np.asarray, jax.jit(padded)(jnp.asarray(x), jnp.int32(valid)))
        want = x.astype(np.float64) @ w
        np.testing.assert_allclose(inside[:valid], want[:valid], rtol=0, atol=1e-5 * np.abs(want).max())
        assert not inside[valid:].any()
        np.testing.assert_allclose(other, want[:4], rtol=0, atol=1e-5 * np.abs(want).max())


@needs_compiler
@pytest.mark.parametrize("rows", [1, 2, 3, 8])
@pytest.mark.parametrize("hidden", [256, 200])
def test_float_head_kernel_equals_x_times_the_table_transposed(rows, hidden):
    """A float32 table [vocab, hidden] read in place (vocab 600 leaves a partial 256-row unit; hidden 200 a tail
    past the last full vector): x @ E^T in float64 to float32 rounding."""
    rng = np.random.default_rng(rows)
    table = rng.standard_normal((600, hidden)).astype(np.float32)
    x = rng.standard_normal((rows, hidden)).astype(np.float32)
    head = jax.tree_util.Partial(float_dot_rows, chunk_rows=lambda: None)
    assert "vllm_jax_float_rows_dot" in jax.jit(head).lower(jnp.asarray(x), jnp.asarray(table)).as_text()
    want = x.astype(np.float64) @ table.astype(np.float64).T
    got = np.asarray(jax.jit(head)(jnp.asarray(x), jnp.asarray(table)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@needs_compiler
def test_float_head_kernel_limits_and_padding():
    """Past MAX_ROWS, for bfloat16 and in a TPU / GPU program the XLA dot stays; inside `padded_rows` the padding's
    logits rows are zeros."""
    table = jnp.asarray(np.random.default_rng(0).standard_normal((300, 64)).astype(np.float32))
    head = jax.tree_util.Partial(float_dot_rows, chunk_rows=lambda: None)

    def calls_native(x, t=table) -> bool:
        return "vllm_jax_float_rows_dot" in jax.jit(head).lower(x, t).as_text()

    assert calls_native(jnp.zeros((float_head.MAX_ROWS, 64)))
    assert not calls_native(jnp.zeros((float_head.MAX_ROWS + 1, 64)))
    assert not calls_native(jnp.zeros((2, 64), jnp.bfloat16), table.astype(jnp.bfloat16))
    for platform in ("tpu", "cuda"):
        exported = jax.export.export(jax.jit(head), platforms=[platform])(jnp.zeros((2, 64)), table)
        assert "vllm_jax_float_rows_dot" not in exported.mlir_module(), platform
    x = jnp.asarray(np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32))

    def padded(x, valid):
        with gguf_matvec.padded_rows(4, valid):
            return head(x, table)

    got = np.asarray(jax.jit(padded)(x, jnp.int32(3)))
    np.testing.assert_allclose(got[:3], np.asarray(dot_rows(x, table, None))[:3], rtol=0, atol=1e-4)
    assert not got[3:].any()


def _float_linear_calls(fn, *args) -> int:
    return jax.jit(fn).lower(*args).as_text().count("custom_call @vllm_jax_float_matvec(")


@needs_compiler
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("inner", [256, 203, 40])
def test_float_linear_kernel_equals_x_times_w(rows, inner):
    """float32 weights [in, out] against x, several in one call: widths past the vector steps, below one vector and
    of one column; `in` with a tail of rows past the kernel's streams (203) and small enough to run on one thread
    (40 x the widths: under kParallelWeights); x @ W in float64 to float32 rounding."""
    rng = np.random.default_rng(rows * inner)
    weights = [rng.standard_normal((inner, out)).astype(np.float32) for out in (200, 12, 1, 64)]
    x = rng.standard_normal((rows, inner)).astype(np.float32)
    args = (jnp.asarray(x), [jnp.asarray(w) for w in weights])
    assert _float_linear_calls(float_dots, *args) == 1
    for got, w in zip(jax.jit(float_dots)(*args), weights):
        want = x.astype(np.float64) @ w.astype(np.float64)
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-5 * np.abs(want).max())


@needs_compiler
def test_float_linear_kernel_limits_padding_and_meshes():
    """Past MAX_ROWS, for bfloat16 or int8 operands, in a TPU / GPU program and in a forward traced over a mesh
    the XLA dot stays; inside `padded_rows` the padding rows' outputs are zeros."""
    w = jnp.asarray(np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32))

    def dots(x, w=w):
        return float_dots(x, [w])[0]

    assert _float_linear_calls(dots, jnp.zeros((float_matvec.MAX_ROWS, 64))) == 1
    assert _float_linear_calls(dots, jnp.zeros((float_matvec.MAX_ROWS + 1, 64))) == 0
    assert _float_linear_calls(lambda x: dots(x, w.astype(jnp.bfloat16)), jnp.zeros((2, 64), jnp.bfloat16)) == 0
    assert _float_linear_calls(lambda x: dots(x, w.astype(jnp.int8)), jnp.zeros((2, 64), jnp.int8)) == 0
    for platform in ("tpu", "cuda"):
        exported = jax.export.export(jax.jit(dots), platforms=[platform])(jnp.zeros((2, 64)))
        assert "vllm_jax_float_matvec" not in exported.mlir_module(), platform

    def on_mesh(x):
        with gguf_matvec.padded_rows(2, jnp.int32(2), sharded=True):
            return dots(x)

    assert _float_linear_calls(on_mesh, jnp.zeros((2, 64))) == 0
    x = jnp.asarray(np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32))

    def padded(x, valid):
        with gguf_matvec.padded_rows(4, valid):
            return dots(x)

    got = np.asarray(jax.jit(padded)(x, jnp.int32(3)))
    np.testing.assert_allclose(got[:3], np.asarray(x @ w)[:3], rtol=0, atol=1e-4)
    assert not got[3:].any()


@needs_compiler
def test_the_layers_q_k_v_are_one_native_call_per_layer():
    """`layers.linears` over switched per-layer float weights: one call of the kernel for q / k / v in each layer's
    branch, equal to each weight's own product."""
    from vllm_jax.model.layers import linears
    from vllm_jax.model.weight_forms.dense import DenseWeight
    from vllm_jax.model.weight_forms.layer_switch import LayerSwitch

    rng = np.random.default_rng(3)
    per_layer = [[jnp.asarray(rng.standard_normal((32, n)).astype(np.float32)) for n in (32, 16, 16)]
                 for _ in range(3)]
    x = jnp.asarray(rng.standard_normal((2, 32)).astype(np.float32))

    def qkv(x, layer):
        switches = [LayerSwitch(tuple(DenseWeight(ws[j]) for ws in per_layer), layer) for j in range(3)]
        return linears(x, switches, [None, None, None])

    assert _float_linear_calls(qkv, x, jnp.int32(1)) == 3  # one per layer's branch
    for got, w in zip(jax.jit(qkv)(x, jnp.int32(1)), per_layer[1]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(x) @ np.asarray(w), rtol=0, atol=1e-5)


@needs_compiler
def test_the_float_forward_reads_its_linears_natively(tmp_path, monkeypatch):
    """The engine's CPU forward in a bucket of at most 8 tokens: in every layer one native call for the fused q / k /
    v weight (model/fused_projections.py), one for gate / up, one each for o and down; its logits equal the XLA
    dots' within float32 rounding."""
    from tests.helpers.quantized_models import make_quant_checkpoint, quant_runner
    from vllm_jax.worker.batch import RowChunk, pack_step_inputs

    model = make_quant_checkpoint(tmp_path / "model")

    def logits(runner) -> np.ndarray:
        rows = [RowChunk(token_ids=[5, 17, 200], num_computed=0, block_ids=[1]),
                RowChunk(token_ids=[99, 3], num_computed=0, block_ids=[2])]
        inputs = pack_step_inputs(rows, block_size=runner.block_size, max_blocks_per_seq=runner.max_blocks_per_seq,
                                  num_tokens_padded=8, num_seqs_padded=runner.seq_bucket(8))
        return np.asarray(runner.step(inputs))[:2]

    calls = []
    traced = float_matvec.float_matvec
    monkeypatch.setattr(float_matvec, "float_matvec", lambda x, valid, *weights: calls.append(
        tuple(w.shape[-1] for w in weights)) or traced(x, valid, *weights))
    runner = quant_runner(model, None)
    native = logits(runner)
    spec = runner.spec
    widths = {(spec.q_size + 2 * spec.kv_size,), (spec.hidden_size,), (spec.intermediate_size,) * 2}
    assert set(calls) == widths
    monkeypatch.setattr(float_matvec, "applies", lambda x, weights: False)
    xla = logits(quant_runner(model, None))
    np.testing.assert_allclose(native, xla, rtol=0, atol=1e-5 * np.abs(xla).max())


def test_real_logits_rows_counts_the_rows_before_the_padding():
    """Real logits rows point at increasing token indices and the padding's at 0: a decode batch (whose first row
    is token 0), chunks ending elsewhere, verified drafts' rows and every token's row (prompt logprobs)."""
    from vllm_jax.worker.batch import RowChunk, pack_step_inputs

    rows = [RowChunk([5], 10, [1]), RowChunk([6], 3, [2]), RowChunk([7, 8], 0, [3])]
    packed = pack_step_inputs(rows, block_size=16, max_blocks_per_seq=2, num_tokens_padded=8, num_seqs_padded=8)
    assert list(packed.logits_indices[:4]) == [0, 1, 3, 0]
    cases = [(packed.logits_indices, 3), (np.array([0, 0, 0, 0]), 1), (np.array([4, 9, 0, 0]), 2),
             (np.array([0, 1, 2, 5, 6, 0, 0, 0]), 5), (np.arange(6), 6)]
    for indices, real in cases:
        assert int(jax.jit(real_logits_rows)(jnp.asarray(indices, jnp.int32))[0]) == real, indices


@needs_compiler
def test_more_rows_than_the_kernels_take_use_the_xla_path():
    parts = _kept((64, 64), "q4_1", axis=-2)
    args = (parts["values"], parts["scale"], parts["min"])
    dot = jax.tree_util.Partial(gguf_dot, fmt="q4_1")
    assert _program_calls_native(dot, jnp.zeros((gguf_matvec.MAX_ROWS, 64)), *args)
    assert not _program_calls_native(dot, jnp.zeros((gguf_matvec.MAX_ROWS + 1, 64)), *args)
    assert not _program_calls_native(dot, jnp.zeros((2, 64), jnp.bfloat16), *args)  # float32 activations only


@needs_compiler
def test_accelerator_programs_keep_the_xla_path():
    """A TPU or GPU program built on this CPU host lowers only the dequantizing dot (platform_dependent)."""
    parts = _kept((64, 64), "q4_1", axis=-2)
    dot = jax.tree_util.Partial(gguf_dot, fmt="q4_1")
    args = (jnp.zeros((2, 64)), parts["values"], parts["scale"], parts["min"])
    for platform in ("tpu", "cuda"):
        exported = jax.export.export(jax.jit(dot), platforms=[platform])(*args)
        assert "vllm_jax_gguf_" not in exported.mlir_module(), platform
    assert _program_calls_native(dot, *args)  # and the CPU's does (jax.export refuses custom calls for CPU)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(build.ENV_SWITCH, "0")
    assert build.library.__wrapped__("gguf_matvec.cc") is None


def test_a_failed_build_warns_and_leaves_the_xla_path(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("VLLM_JAX_CACHE_ROOT", str(tmp_path))
    monkeypatch.setenv("CXX", shutil.which("false") or "false")
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        assert build.library.__wrapped__("gguf_matvec.cc") is None
    assert "could not be built" in caplog.text
    assert not list(tmp_path.rglob("*.so"))  # no half-written library left behind


# ---- paged attention (native/paged_attention.py) --------------------------------------------------------------

def _attention_case(head_dim: int, kv_heads: int, group: int, seed: int = 0) -> dict:
    """Three live sequences in an 8-token bucket: a decode row at position 99, a 5-row chunk after 32 cached
    tokens, a first token; one padding row. Pages scattered over a 2-layer cache."""
    rng = np.random.default_rng(seed)
    cache = rng.standard_normal((2, 40, 16, 2 * kv_heads, head_dim)).astype(np.float32)
    tables = np.zeros((4, 8), np.int32)
    tables[0, :7] = rng.permutation(np.arange(1, 40))[:7]
    tables[1, :3] = [31, 5, 17]
    tables[2, 0] = 22
    return dict(q=rng.standard_normal((8, kv_heads * group, head_dim)).astype(np.float32), kv_cache=cache,
                block_tables=tables, seq_lens=np.array([100, 37, 1, 0], np.int32),
                query_start_loc=np.array([0, 1, 6, 7, 7], np.int32), num_seqs=np.array([3], np.int32))


@needs_compiler
@pytest.mark.parametrize("head_dim, kv_heads, group", [(64, 3, 3), (24, 2, 1), (32, 1, 4), (128, 2, 2)])
@pytest.mark.parametrize("window, soft_cap, with_sinks", [(0, None, False), (20, None, False), (0, 30.0, False),
                                                          (0, None, True)])
def test_paged_attention_equals_the_xla_backend(head_dim, kv_heads, group, window, soft_cap, with_sinks):
    """Every live row within float32 rounding of the xla backend's attention (head_dim 24 takes the plain loops;
    32, 64 and 128 keep 2, 4 and 8 vectors of sums in registers); the padding row is zeros."""
    from vllm_jax.native import paged_attention
    from vllm_jax.pallas_kernels import xla_attention

    assert paged_attention.available()
    case = _attention_case(head_dim, kv_heads, group)
    sinks = np.random.default_rng(9).standard_normal(kv_heads * group).astype(np.float32) if with_sinks else None
    want = np.asarray(xla_attention.ragged_paged_attention(
        **jax.tree.map(jnp.asarray, case), sm_scale=0.2, sliding_window=window, soft_cap=soft_cap, layer_index=1,
        sinks=sinks))
    got = np.asarray(jax.jit(paged_attention.paged_attention, static_argnames=("sm_scale", "soft_cap", "v_scale"))(
        case["q"], case["kv_cache"], 1, case["block_tables"], case["seq_lens"], case["query_start_loc"],
        case["num_seqs"], np.int32(window), sinks, sm_scale=0.2, soft_cap=soft_cap, v_scale=1.0))
    np.testing.assert_allclose(got[:7], want[:7], rtol=0, atol=2e-6 * np.abs(want[:7]).max())
    assert not got[7:].any()


@needs_compiler
def test_the_xla_backend_takes_the_native_kernel_only_on_one_cpu_device():
    """A CPU step of at most 64 tokens on one device takes the kernel; a larger bucket, a mesh (GSPMD would gather
    the sharded cache around the call) and a TPU / GPU program keep the XLA ops."""
    from jax.sharding import Mesh

    from vllm_jax.attention.xla import XlaBackend
    from vllm_jax.native import paged_attention

    backend = XlaBackend("cpu")
    case = jax.tree.map(jnp.asarray, _attention_case(64, 3, 3))

    def attend(q, mesh=None):
        return backend.attention(q, case["kv_cache"], case["block_tables"], case["seq_lens"],
                                 case["query_start_loc"], case["num_seqs"], sm_scale=0.2, layer_index=1, mesh=mesh)

    def calls_native(fn, q) -> bool:
        return "vllm_jax_paged_attention" in jax.jit(fn).lower(q).as_text()

    q = jnp.asarray(case["q"])
    assert calls_native(attend, q)
    big = jnp.zeros((paged_attention.MAX_ROWS + 8, 9, 64))
    assert not calls_native(attend, big)
    mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
    assert not calls_native(lambda q: attend(q, mesh), q)
    for platform in ("tpu", "cuda"):
        exported = jax.export.export(jax.jit(attend), platforms=[platform])(q)
        assert "vllm_jax_paged_attention" not in exported.mlir_module(), platform


def test_padding_of_a_forward_traced_on_another_thread_is_not_seen():
    """Warm-up traces forwards on several threads: one thread's padded_rows must not reach another's dots."""
    import threading

    seen = {}
    with gguf_matvec.padded_rows(8, jnp.int32(3)):
        mine = gguf_matvec.valid_rows(8)
        other = threading.Thread(target=lambda: seen.update(rows=gguf_matvec.valid_rows(8)))
        other.start()
        other.join()
    assert int(mine[0]) == 3 and int(seen["rows"][0]) == 8

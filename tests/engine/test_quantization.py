"""--quantization int8 / fp8 (model/quantization.py; docs/architecture/06-model.md, "Quantized weights").

Bounds. Per output channel j, a weight's values are round(w / s_j) with s_j = absmax_j / 127 (int8), so each
element is off by at most s_j / 2; W8A8 (int8 on CPU) also rounds each activation row to s_x = absmax_x / 127, off
by at most s_x / 2 per element. For y_j = sum_i x_i w_ij that gives the exact worst case checked below:
|dy_j| <= s_x / 2 * sum_i |w_ij| + s_j / 2 * sum_i |x_i| + K s_x s_j / 4. fp8 e4m3 keeps 3 mantissa bits: each
normal element is within 2^-4 of itself relative, subnormals (below 2^-6 s_j) within 2^-10 s_j.
The embedding (online quantization) has one scale per vocab row over H, the same bounds per row.
Through a model the errors compound; on the tiny 4-layer model (random weights, std 0.1, which amplify a
perturbation layer by layer) the logits' relative L2 error measured 0.069 for int8 and 0.134 for fp8 with a float
embedding, 0.055 and 0.144 with it quantized too (its rounding is independent of the layers'; int8 moved down by
chance). The bounds below stay as they were, still about twice that; a 25% error in every scale, or scales shifted
by one channel, measured 0.46-0.82 (0.53 / 0.57 with the embedding's), a 25% error in the embedding's row scales
alone 0.27 (int8) / 0.33 (fp8), and the test checks such broken scales land above the bound.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from tests.helpers.quantized_models import (
    QUANT_MODEL,
    dequantized_logits,
    make_quant_checkpoint,
    param_bytes,
    prompt_logits,
    quant_runner,
    relative_error,
)
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax import EngineArgs
from vllm_jax.model.layers import linear
from vllm_jax.model.quantization import dequantize, quantize, quantize_table
from vllm_jax.model.quantized_dots import dot_rows, quantized_dot_rows
from vllm_jax.model.weight_forms.channel_scaled import ChannelScaledWeight
from vllm_jax.model.weight_forms.dense import DenseWeight

LOGIT_BOUNDS = {"int8": 0.15, "fp8": 0.25}  # relative L2 error of the logits vs float32 (measured 0.069, 0.134)


# ---- quantize / dequantize -------------------------------------------------------------------------------

def _weight(rng, shape=(3, 96, 40)):
    w = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.01, 2.0, shape[:-2] + (1, shape[-1]))
    w[..., 5] = 0.0  # an all-zero output channel
    return w


def test_int8_scales_are_channel_absmax_over_127_and_error_is_half_a_step():
    w = _weight(np.random.default_rng(0))
    values, scale = quantize(w, "int8")
    assert values.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (3, 40)
    amax = np.abs(w).max(axis=-2)
    np.testing.assert_allclose(scale[amax > 0], amax[amax > 0] / 127, rtol=1e-6)
    assert np.all(scale[..., 5] == 1.0) and np.all(values[..., 5] == 0)  # zero channel: no division by zero
    assert np.abs(values).max() == 127  # each channel's largest element maps to +-127
    err = np.abs(dequantize(values, scale) - w)
    assert np.all(err <= scale[..., None, :] / 2 * (1 + 1e-5))


def test_fp8_scales_are_channel_absmax_over_448_and_error_is_relative():
    w = _weight(np.random.default_rng(1))
    values, scale = quantize(w, "fp8")
    assert values.dtype == ml_dtypes.float8_e4m3fn and scale.shape == (3, 40)
    amax = np.abs(w).max(axis=-2)
    np.testing.assert_allclose(scale[amax > 0], amax[amax > 0] / 448, rtol=1e-6)
    assert np.all(np.isfinite(values.astype(np.float32))) and np.abs(values.astype(np.float32)).max() == 448
    s = scale[..., None, :]
    err = np.abs(dequantize(values, scale) - w)
    assert np.all(err <= np.maximum(np.abs(w) * 2.0 ** -4, s * 2.0 ** -10) * (1 + 1e-5))


def test_numpy_and_jax_quantize_agree():
    w = _weight(np.random.default_rng(2))
    for scheme in ("int8", "fp8"):
        (v_np, s_np), (v_j, s_j) = quantize(w, scheme), quantize(jnp.asarray(w), scheme)
        np.testing.assert_array_equal(v_np.astype(np.float32), np.asarray(v_j).astype(np.float32))
        np.testing.assert_allclose(s_np, np.asarray(s_j), rtol=1e-6)  # XLA may divide 1 ulp off


def test_w8a8_and_weight_only_linear_stay_within_their_worst_case_bounds():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 96)).astype(np.float32) * rng.uniform(0.1, 3.0, (6, 1))
    w = _weight(rng, (96, 40))
    exact = x @ w
    values, scale = quantize(w, "int8")

    def channel_scaled(quantize_activations: bool) -> ChannelScaledWeight:
        return ChannelScaledWeight(DenseWeight(jnp.asarray(values)), jnp.asarray(scale), quantize_activations)

    w8a8 = np.asarray(linear(jnp.asarray(x), channel_scaled(True)))
    sx = np.abs(x).max(axis=-1, keepdims=True) / 127
    bound = (sx / 2 * np.abs(w).sum(0) + scale / 2 * np.abs(x).sum(-1, keepdims=True)
             + x.shape[1] * sx * scale / 4)
    assert np.all(np.abs(w8a8 - exact) <= bound * (1 + 1e-4) + 1e-5)
    weight_only = np.asarray(linear(jnp.asarray(x), channel_scaled(False)))
    assert np.all(np.abs(weight_only - exact) <= scale / 2 * np.abs(x).sum(-1, keepdims=True) * (1 + 1e-4) + 1e-5)
    assert np.max(np.abs(w8a8 - exact)) > np.max(np.abs(weight_only - exact))  # the activations' rounding shows


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_embedding_rows_quantized_per_row_and_the_tied_head_within_its_bound(scheme):
    """One scale per vocab row (reduced over H): each element within half a step (int8) or 2^-4 relative (fp8), as
    for a channel; the tied head x @ E^T, chunked (CPU) or not, within sum_k |x_k| * max error of row v; 25%-off
    scales exceed that."""
    rng = np.random.default_rng(4)
    table = rng.standard_normal((256, 96)).astype(np.float32) * rng.uniform(0.01, 2.0, (256, 1))
    table[7] = 0.0  # an all-zero row
    values, scale = quantize_table(table, scheme)
    assert values.shape == table.shape and scale.shape == (256, 1) and scale[7, 0] == 1.0
    amax, qmax = np.abs(table).max(-1), {"int8": 127, "fp8": 448}[scheme]
    np.testing.assert_allclose(scale[:, 0], np.where(amax > 0, amax / qmax, 1.0), rtol=1e-6)
    err = np.abs(dequantize(values, scale) - table)
    bound = (scale / 2 if scheme == "int8" else np.maximum(np.abs(table) * 2.0 ** -4, scale * 2.0 ** -10))
    assert np.all(err <= bound * (1 + 1e-5))
    x = rng.standard_normal((3, 96)).astype(np.float32)
    exact = x @ table.T
    head_bound = np.abs(x).sum(-1, keepdims=True) * err.max(-1)  # [3, V]
    for chunk_rows in (None, 64):
        got = np.asarray(quantized_dot_rows(jnp.asarray(x), jnp.asarray(values), jnp.asarray(scale), chunk_rows))
        assert np.all(np.abs(got - exact) <= head_bound * (1 + 1e-4) + 1e-5)
    wrong = np.asarray(quantized_dot_rows(jnp.asarray(x), jnp.asarray(values), jnp.asarray(scale * 1.25), 64))
    assert np.max(np.abs(wrong - exact) - head_bound) > 0


@pytest.mark.parametrize("vocab, target, chunks", [(96, 40, 3), (96, 20, 6), (97, 40, 1)])
def test_a_tied_quantized_head_in_row_chunks_equals_the_whole_table(vocab, target, chunks):
    """The head runs over equal chunks of vocab rows (the largest divisor of the vocab size at most the target and
    above a quarter of it: 96 rows at 40 -> three of 32, at 20 -> six of 16; none for 97) with the whole table's
    logits."""
    table = np.random.RandomState(1).randn(vocab, 16).astype(np.float32)
    values, scale = quantize_table(jnp.asarray(table), "int8")
    x = jnp.asarray(np.random.RandomState(2).randn(3, 16).astype(np.float32))
    whole = quantized_dot_rows(x, values, scale, None)
    chunked = jax.jit(quantized_dot_rows, static_argnums=3)(x, values, scale, target)
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)
    program = str(jax.make_jaxpr(quantized_dot_rows, static_argnums=3)(x, values, scale, target))
    assert ("while[" in program or "scan[" in program) == (chunks > 1)


def test_a_float_tied_head_in_row_chunks_gives_the_whole_tables_logits_bit_for_bit():
    """The float tied head's CPU chunk loop (dot_rows) changes no logit: each is the same dot over hidden."""
    table = jnp.asarray(np.random.RandomState(3).randn(256, 64).astype(np.float32))
    x = jnp.asarray(np.random.RandomState(4).randn(2, 64).astype(np.float32))
    whole = jax.jit(dot_rows, static_argnums=2)(x, table, None)
    np.testing.assert_array_equal(jax.jit(dot_rows, static_argnums=2)(x, table, 64), whole)
    np.testing.assert_allclose(whole, np.asarray(x) @ np.asarray(table).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("slow", ["whole", "chunks"])
def test_the_float_tied_head_takes_whichever_layout_this_machine_runs_faster(monkeypatch, slow):
    """float_head_chunk_rows times both layouts (a variant slowed by a sleeping callback must lose), once per
    shape, when first asked while a forward is traced (as the engine's CPU head asks)."""
    import time

    from vllm_jax.model import quantized_dots

    real = quantized_dots.dot_rows

    def dot_rows_slowed(x, table, chunk_rows):
        if (chunk_rows is None) == (slow == "whole"):
            x = jax.pure_callback(lambda a: (time.sleep(0.02), a)[1], jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return real(x, table, chunk_rows)

    monkeypatch.setattr(quantized_dots, "dot_rows", dot_rows_slowed)
    quantized_dots.float_head_chunk_rows.cache_clear()
    try:
        asked = []
        jax.jit(lambda x: asked.append(quantized_dots.float_head_chunk_rows(320, 16, "float32", 32)) or x).lower(
            jnp.zeros(()))
        expected = 32 if slow == "whole" else None
        assert asked == [expected]
        assert quantized_dots.float_head_chunk_rows(320, 16, "float32", 32) == expected
        assert quantized_dots.float_head_chunk_rows.cache_info().misses == 1
    finally:
        quantized_dots.float_head_chunk_rows.cache_clear()


def test_unknown_quantization_is_a_value_error_naming_the_flag():
    with pytest.raises(ValueError, match=r"quantization must be one of int8, fp8, compressed-tensors, gguf; "
                                         r"got 'int4'"):
        EngineArgs(model=None, quantization="int4").create_config()


# ---- a tiny model: logits, bytes, engine -----------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_quant_checkpoint(tmp_path_factory.mktemp("quant") / "llama")


@pytest.fixture(scope="module")
def float_runner(model_dir):
    return quant_runner(model_dir, None)


@pytest.fixture(scope="module")
def reference(float_runner):
    return prompt_logits(float_runner), param_bytes(float_runner)


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_logits_within_bound_of_float32_and_a_broken_scale_is_caught(model_dir, float_runner, reference, scheme):
    ref_logits, ref_bytes = reference
    runner = quant_runner(model_dir, scheme)
    layers = nnx.to_pure_dict(runner.params)["layers"]
    assert layers["q_proj"][0].dtype == jnp.dtype({"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}[scheme])
    assert layers["down_proj_scale"][0].dtype == jnp.float32
    state = nnx.to_pure_dict(runner.params)  # online: the tied embedding quantized per vocab row
    assert state["embed_tokens"].dtype == layers["q_proj"][0].dtype and state["embed_tokens_scale"].shape == (320, 1)
    logits = prompt_logits(runner)
    assert relative_error(logits, ref_logits) < LOGIT_BOUNDS[scheme]
    assert (logits.argmax(-1) == ref_logits.argmax(-1)).all()
    # every float leaf left is small: norms, scales; <= 35% of the float32 model's bytes (measured 25.7% here; the
    # default model's 25.2%, 135.4 of 538.1 MB)
    assert param_bytes(runner) <= 0.35 * ref_bytes
    # the same program over wrong scales (25% off; all of them, then the embedding's alone): the bound catches it
    params = runner.device.params
    for broken in ("_scale", "embed_tokens_scale"):
        runner.device.params = jax.tree_util.tree_map_with_path(
            lambda path, v, broken=broken: v * 1.25 if broken in jax.tree_util.keystr(path) else v, params)
        assert relative_error(prompt_logits(runner), ref_logits) > LOGIT_BOUNDS[scheme]
    runner.device.params = params
    if scheme == "fp8":  # weight-only on CPU: exactly the float model with the dequantized weights
        np.testing.assert_allclose(logits, dequantized_logits(float_runner, params), rtol=1e-5, atol=1e-5)


FP8_KV_BOUND = 0.15  # the fp8 KV cache's own share of the logits' relative error here (measured 0.076 alone)


@pytest.mark.parametrize("scheme", ["fp8"])  # int8 measured 0.094
def test_quantized_weights_with_an_fp8_kv_cache(model_dir, reference, scheme):
    """Quantized weights and --kv-cache-dtype fp8 together: the cache really is float8 (a quarter of float32's
    bytes) and the logits stay within the two errors' bounds added (measured 0.156)."""
    runner = quant_runner(model_dir, scheme, kv_cache_dtype="fp8")
    assert runner.kv_cache.dtype == jnp.float8_e4m3fn
    logits = prompt_logits(runner)
    assert relative_error(logits, reference[0]) < LOGIT_BOUNDS[scheme] + FP8_KV_BOUND
    assert relative_error(logits, prompt_logits(quant_runner(model_dir, scheme))) > 1e-3  # the cache's rounding shows


def test_untied_lm_head_quantized_per_vocab_channel(tmp_path):
    """An untied LM head [H, V] under online fp8: values plus a [V] scale like a linear's; weight-only on CPU, so
    exactly the float model with every weight (embedding and head included) dequantized."""
    model_dir = tmp_path / "llama"
    make_tiny_checkpoint("llama", model_dir, seed=3, **{**QUANT_MODEL, "tie_word_embeddings": False})
    float_untied, fp8 = quant_runner(model_dir, None), quant_runner(model_dir, "fp8")
    state = nnx.to_pure_dict(fp8.params)
    assert state["lm_head"].dtype == jnp.float8_e4m3fn and state["lm_head_scale"].shape == (320,)
    np.testing.assert_allclose(prompt_logits(fp8), dequantized_logits(float_untied, fp8.params), rtol=1e-5,
                               atol=1e-5)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("quant_moe") / "mixtral"
    make_tiny_checkpoint("mixtral", path, seed=2)
    return path


def test_moe_experts_quantized_weight_only(moe_dir):
    """Mixtral (4 experts, top 2), fp8: exactly the float model with dequantized weights (the experts' per-row
    scales included). Its error vs float32 is not bounded here: a routing flip makes it jump (measured 0.35 for
    fp8, 0.022 for int8 on this model), while the dense model above is checked for that."""
    float_moe = quant_runner(moe_dir, None)
    fp8 = quant_runner(moe_dir, "fp8")
    layers = nnx.to_pure_dict(fp8.params)["layers"]
    assert layers["experts_gate"].dtype == jnp.float8_e4m3fn and layers["experts_gate_scale"].shape == (2, 4, 96)
    assert layers["router"].dtype == jnp.float32
    np.testing.assert_allclose(prompt_logits(fp8), dequantized_logits(float_moe, fp8.params), rtol=1e-5, atol=1e-5)


def test_int8_engine_compiles_nothing_after_warm_up(model_dir):
    from vllm_jax import LLM, SamplingParams

    # one bucket (2 tokens, 2 rows), no async scheduling: the fewest programs to warm up
    args = dict(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=2, num_gpu_blocks_override=16,
                async_scheduling=False, compilation_cache=False)
    llm = LLM(str(model_dir), quantization="int8", **args)
    before = llm.llm_engine.runner.num_compilations
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outs = llm.generate([[5, 17, 200, 33, 41], [99, 3]], params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 6 for o in outs)
    assert llm.llm_engine.runner.num_compilations == before

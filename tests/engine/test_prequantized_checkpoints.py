"""Pre-quantized HF checkpoints (model_loader/prequantized*.py; docs/architecture/06-model.md, "Quantized weights").

A tiny float Llama (transformers' save_pretrained) is rewritten as each format stores it: compressed-tensors fp8
per channel and per tensor, compressed-tensors int8 per channel, and block fp8 ([128, 128], `weight_scale_inv`).
The reference is our float32 model over exactly the weights the checkpoint stands for (values x scales).

Bounds. fp8 is weight-only on every platform and the values are placed as stored, so the logits equal the
reference up to float rounding (the dot converts the values inside and scales its output, the reference scales the
weights first; a grouped scale's partial sums add in another order): rtol 1e-5. int8 on CPU is W8A8: each
activation row is also rounded to absmax / 127 (tests/engine/test_quantization.py derives the per-element bound); on
this model the logits' relative L2 error vs the reference measured 0.034, the bound is 0.08, and every scale 25% off
measured 0.54 (checked above the bound; 0.54 for fp8 too, whose exact match already excludes it).
"""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from tests.helpers.prequantized_checkpoints import (
    SCHEMES,
    make_float_checkpoint,
    make_prequantized,
    set_quantization_config,
)
from tests.helpers.quantized_models import dequantized_logits, prompt_logits, quant_runner, relative_error
from vllm_jax import EngineArgs
from vllm_jax.model.quantization import dequantize
from vllm_jax.model_loader.errors import ModelSourceError

INT8_W8A8_BOUND = 0.08  # relative L2 error of the logits vs the dequantized float32 model (measured 0.034)
LINEARS = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
           "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
           "down_proj": "mlp.down_proj"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("prequant")
    float_dir = make_float_checkpoint(root / "float")
    for scheme in SCHEMES:
        make_prequantized(float_dir, root, scheme)
    return root


@pytest.fixture(scope="module")
def float_runner(workdir):
    return quant_runner(workdir / "float", None)


@pytest.fixture(scope="module")
def runners(workdir):
    """One runner per scheme, built on first use and shared by the tests."""
    cache: dict = {}

    def get(scheme: str):
        if scheme not in cache:
            cache[scheme] = quant_runner(workdir / scheme, None)
        return cache[scheme]
    return get


def _config(model_dir, **args):
    return EngineArgs(model=str(model_dir), max_model_len=64, **args).create_config().model_config


def _dequantized_checkpoint(model_dir) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(model_dir.parent / f"{model_dir.name}_dequantized" / "model.safetensors"))


def _check_weights_are_the_checkpoints(runner, model_dir):
    """Every quantized param pair dequantizes to exactly the weights the checkpoint stands for."""
    layers = nnx.to_pure_dict(runner.params)["layers"]
    reference = _dequantized_checkpoint(model_dir)
    for name, hf in LINEARS.items():
        for i in range(2):
            pair = dequantize(np.asarray(layers[name][i]), np.asarray(layers[f"{name}_scale"][i]))
            np.testing.assert_array_equal(pair, reference[f"model.layers.{i}.{hf}.weight"].T, err_msg=name)


# ---- which quantization, from config.json ------------------------------------------------------------------

@pytest.mark.parametrize("scheme, ours, group", [("ct_fp8_channel", "fp8", None), ("ct_fp8_tensor", "fp8", None),
                                                 ("ct_int8_channel", "int8", None), ("fp8_block", "fp8", 128)])
def test_quantization_comes_from_the_checkpoint(workdir, scheme, ours, group):
    config = _config(workdir / scheme)
    assert (config.quantization, config.quantization_group_size) == (ours, group)
    method = "fp8" if scheme == "fp8_block" else "compressed-tensors"
    assert _config(workdir / scheme, quantization=method).quantization == ours  # vLLM's method name
    assert _config(workdir / scheme, quantization=ours).quantization == ours  # the values' scheme
    other = "fp8" if ours == "int8" else "int8"
    with pytest.raises(ValueError, match=rf"quantization '{other}' conflicts with .*quantization_config "
                                         rf"\({method} \({ours}, .*omit --quantization or pass '{method}'"):
        _config(workdir / scheme, quantization=other)


def test_compressed_tensors_block_config_and_regex_ignore(tmp_path):
    """llm-compressor's FP8_BLOCK preset (block weights, dynamic per-group activations, `re:` ignores) reads as the
    fp8 block format does: a 128-row grouped scale."""
    from tests.helpers.prequantized_checkpoints import ct_config
    from vllm_jax.model_loader.prequantized import read_prequantized_config

    cfg = ct_config("float", "block", "float-quantized", True)
    group = cfg["config_groups"]["group_0"]
    group["weights"]["block_structure"] = [128, 128]
    group["input_activations"].update(strategy="group", group_size=128)
    cfg["ignore"] = ["re:.*gate$", "lm_head", "model.embed_tokens"]
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": cfg}))
    read = read_prequantized_config(tmp_path)
    assert (read.method, read.scheme, read.strategies, read.block, read.group_size) == (
        "compressed-tensors", "fp8", frozenset({"block"}), (128, 128), 128)
    assert read.is_ignored("model.layers.3.mlp.gate") and read.is_ignored("lm_head")
    assert not read.is_ignored("model.layers.3.mlp.gate_proj")


def test_compressed_tensors_flag_on_a_float_checkpoint_is_an_error(workdir):
    with pytest.raises(ValueError, match="reads a pre-quantized checkpoint.*no quantization_config"):
        _config(workdir / "float", quantization="compressed-tensors")


# ---- logits ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["ct_fp8_channel", "ct_fp8_tensor", "fp8_block"])
def test_fp8_logits_equal_the_float_model_over_the_dequantized_weights(workdir, float_runner, runners, scheme):
    runner = runners(scheme)
    layers = nnx.to_pure_dict(runner.params)["layers"]
    assert layers["q_proj"][0].dtype == jnp.float8_e4m3fn
    if scheme == "fp8_block":  # grouped [in // g, out]: 64-wide inputs one group, down (256) two
        assert layers["q_proj_scale"][0].shape == (1, 64) and layers["down_proj_scale"][0].shape == (2, 64)
    else:
        assert layers["q_proj_scale"][0].shape == (64,)
    assert nnx.to_pure_dict(runner.params)["lm_head"].dtype == jnp.float32  # on the ignore list / unquantized
    _check_weights_are_the_checkpoints(runner, workdir / scheme)
    logits = prompt_logits(runner)
    np.testing.assert_allclose(logits, dequantized_logits(float_runner, runner.params), rtol=1e-5, atol=1e-5)


def test_stored_values_keep_their_bits(workdir, runners):
    """No requantization: the placed values are the checkpoint's bytes (transposed to [in, out])."""
    from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint

    for scheme in ("ct_int8_channel", "fp8_block"):
        stored = SafetensorsCheckpoint(workdir / scheme)
        runner = runners(scheme)
        values = np.asarray(nnx.to_pure_dict(runner.params)["layers"]["down_proj"][1])
        raw = stored.read("model.layers.1.mlp.down_proj.weight", ())
        np.testing.assert_array_equal(values.view(np.uint8), raw.T.view(np.uint8))


def test_fp8_per_tensor_checkpoint_without_blocks(workdir, tmp_path):
    """`quant_method: fp8` without `weight_block_size` (per-tensor `weight_scale`, dynamic activations) reads as
    compressed-tensors' tensor strategy does."""
    fp8 = tmp_path / "fp8_tensor"
    shutil.copytree(workdir / "ct_fp8_tensor", fp8)
    set_quantization_config(fp8, {"activation_scheme": "dynamic", "quant_method": "fp8"})
    assert (_config(fp8).quantization, _config(fp8).quantization_group_size) == ("fp8", None)
    (tmp_path / "fp8_tensor_dequantized").symlink_to(workdir / "ct_fp8_tensor_dequantized")
    _check_weights_are_the_checkpoints(quant_runner(fp8, None), fp8)


def test_an_ignored_layer_linear_is_refused(workdir, tmp_path, monkeypatch):
    """A linear we keep quantized in every layer, left float by `ignore` in one: named, nothing placed."""
    name = "model.layers.1.self_attn.o_proj.weight"

    def edit(tensors):
        tensors[name] = tensors[name].astype(np.float32) * tensors.pop(name + "_scale").astype(np.float32)

    bad, _ = make_prequantized(workdir / "float", tmp_path, "ct_fp8_channel", name="ignored", edit=edit)
    cfg = json.loads((bad / "config.json").read_text())["quantization_config"]
    cfg["ignore"].append("re:.*layers\\.1\\.self_attn\\.o_proj$")
    set_quantization_config(bad, cfg)
    monkeypatch.setattr(jax, "make_array_from_callback", _refuse_placement)
    with pytest.raises(ModelSourceError, match=r"model.layers.1.self_attn.o_proj is on the quantization_config's "
                                               r"ignore list"):
        quant_runner(bad, None)


def test_int8_w8a8_logits_within_bound_and_a_wrong_scale_is_caught(workdir, float_runner, runners):
    runner = runners("ct_int8_channel")
    layers = nnx.to_pure_dict(runner.params)["layers"]
    assert layers["q_proj"][0].dtype == jnp.int8 and layers["q_proj_scale"][0].shape == (64,)
    _check_weights_are_the_checkpoints(runner, workdir / "ct_int8_channel")
    reference = dequantized_logits(float_runner, runner.params)
    logits = prompt_logits(runner)
    assert relative_error(logits, reference) < INT8_W8A8_BOUND
    assert (logits.argmax(-1) == reference.argmax(-1)).all()
    params = runner.device.params
    runner.device.params = jax.tree_util.tree_map_with_path(
        lambda path, v: v * 1.25 if "_scale" in jax.tree_util.keystr(path) else v, params)
    assert relative_error(prompt_logits(runner), reference) > INT8_W8A8_BOUND
    runner.device.params = params


def test_a_float_model_of_a_prequantized_checkpoint_is_dequantized(workdir):
    """A model built without quantization (as a draft model is) reads every quantized tensor dequantized."""
    from vllm_jax.model_loader.loader import build_model
    from vllm_jax.model_loader.source import load_hf_config, resolve_model_source
    from vllm_jax.models.registry import resolve_architecture

    source = resolve_model_source(str(workdir / "fp8_block"))
    entry, spec = resolve_architecture(load_hf_config(source))
    model = build_model(entry, spec, "float32", source, platform="cpu")
    reference = _dequantized_checkpoint(workdir / "fp8_block")
    np.testing.assert_array_equal(np.asarray(model.layers.down_proj[...][1]),
                                  reference["model.layers.1.mlp.down_proj.weight"].T)


def test_block_fp8_moe_experts_are_requantized_per_channel(tmp_path):
    """Mixtral (4 experts, [256, 64] / [64, 256] each): attention read exactly with grouped scales; the experts
    keep per-channel scales, so their blocks are dequantized and requantized per channel (fp8 rounding, the one
    inexact case), exactly as `quantize` does it; the logits are the float model's over the placed weights."""
    from vllm_jax.model.quantization import quantize

    pq, deq = make_prequantized(make_float_checkpoint(tmp_path / "float", "mixtral"), tmp_path, "fp8_block",
                                name="mixtral")
    runner = quant_runner(pq, None)
    layers = nnx.to_pure_dict(runner.params)["layers"]
    assert layers["q_proj_scale"].shape == (2, 1, 64) and layers["experts_down_scale"].shape == (2, 4, 64)
    assert layers["router"].dtype == jnp.float32
    reference = _dequantized_checkpoint(pq)
    np.testing.assert_array_equal(dequantize(np.asarray(layers["o_proj"][1]), np.asarray(layers["o_proj_scale"][1])),
                                  reference["model.layers.1.self_attn.o_proj.weight"].T)
    w2 = reference["model.layers.1.block_sparse_moe.experts.3.w2.weight"].T
    values, scale = quantize(w2, "fp8")
    np.testing.assert_array_equal(np.asarray(layers["experts_down"][1, 3]).view(np.uint8), values.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(layers["experts_down_scale"][1, 3]), scale)
    assert not np.array_equal(dequantize(values, scale), w2)  # requantized: not the checkpoint's weights exactly
    np.testing.assert_allclose(prompt_logits(runner), dequantized_logits(quant_runner(deq, None), runner.params),
                               rtol=1e-5, atol=1e-5)


# ---- bad input ---------------------------------------------------------------------------------------------

def _ct_group(cfg):
    return cfg["config_groups"]["group_0"]


UNSUPPORTED = {
    "int4": ("ct_fp8_channel", lambda c: _ct_group(c)["weights"].update(num_bits=4, type="int"),
             r"weights: num_bits 4 is not supported"),
    "asymmetric": ("ct_int8_channel", lambda c: _ct_group(c)["weights"].update(symmetric=False),
                   r"weights: asymmetric weights .* not supported"),
    "group": ("ct_int8_channel", lambda c: _ct_group(c)["weights"].update(strategy="group", group_size=128),
              r"weights: strategy 'group' is not supported"),
    "static_inputs": ("ct_fp8_channel", lambda c: _ct_group(c)["input_activations"].update(dynamic=False,
                                                                                             strategy="tensor"),
                      r"input_activations: static activation scales .* not supported"),
    "packed": ("ct_int8_channel", lambda c: c.update(format="pack-quantized"),
               r"compressed-tensors format 'pack-quantized' is not supported"),
    "fp8_static": ("fp8_block", lambda c: c.update(activation_scheme="static"),
                   r"activation_scheme 'static' is not supported"),
    "awq": ("fp8_block", lambda c: c.update(quant_method="awq"), r"quant_method 'awq' is not supported"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_an_unsupported_scheme_is_one_error_naming_it(workdir, tmp_path, case):
    scheme, edit, message = UNSUPPORTED[case]
    bad = tmp_path / case
    shutil.copytree(workdir / scheme, bad)
    cfg = json.loads((bad / "config.json").read_text())["quantization_config"]
    edit(cfg)
    set_quantization_config(bad, cfg)
    with pytest.raises(ModelSourceError, match=rf"config.json: quantization_config.*{message}"):
        _config(bad)


def _refuse_placement(*args, **kwargs):
    raise AssertionError("an array was placed before the checkpoint was checked")


def test_a_scale_not_matching_its_weight_names_both(workdir, monkeypatch):
    name = "model.layers.1.mlp.down_proj.weight"

    def edit(tensors):
        tensors[name + "_scale"] = np.ones((63, 1), ml_dtypes.bfloat16)

    bad, _ = make_prequantized(workdir / "float", workdir, "ct_fp8_channel", name="bad_scale", edit=edit)
    monkeypatch.setattr(jax, "make_array_from_callback", _refuse_placement)  # nothing half-loaded
    with pytest.raises(ModelSourceError, match=rf"scale '{name}_scale' has shape \(63, 1\), which does not match "
                                               rf"weight '{name}' of shape \(64, 256\) \(expected \(64, 1\)"):
        quant_runner(bad, None)


def test_a_block_scale_of_the_wrong_grid_names_both(workdir, monkeypatch):
    name = "model.layers.0.mlp.gate_proj.weight"

    def edit(tensors):
        tensors[name + "_scale_inv"] = np.ones((1, 1), np.float32)  # [256, 64] needs 2 x 1 blocks

    bad, _ = make_prequantized(workdir / "float", workdir, "fp8_block", name="bad_block", edit=edit)
    monkeypatch.setattr(jax, "make_array_from_callback", _refuse_placement)
    with pytest.raises(ModelSourceError, match=rf"'{name}_scale_inv' has shape \(1, 1\).*\(256, 64\).*\(2, 1\)"):
        quant_runner(bad, None)


def test_a_missing_scale_names_the_tensor(workdir, monkeypatch):
    name = "model.layers.0.self_attn.k_proj.weight"
    bad, _ = make_prequantized(workdir / "float", workdir, "ct_int8_channel", name="no_scale",
                               edit=lambda tensors: tensors.pop(name + "_scale"))
    monkeypatch.setattr(jax, "make_array_from_callback", _refuse_placement)
    with pytest.raises(ModelSourceError, match=rf"tensor '{name}' is stored as I8 but the checkpoint has no "
                                               r"model.layers.0.self_attn.k_proj.weight_scale"):
        quant_runner(bad, None)

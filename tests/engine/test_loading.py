"""Loading params: GGUF twins load to the same params as safetensors; bad checkpoints fail with one clear error."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from tests.engine.test_gguf import (
    llama,  # noqa: F401  (module fixture: a tiny llama and its F32 GGUF twin)
    write_gguf,
)
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.loader import build_model
from vllm_jax.model_loader.source import load_hf_config, resolve_model_source
from vllm_jax.models.registry import resolve_architecture


def _params(path: str, dtype: str = "float32") -> dict:
    source = resolve_model_source(path)
    entry, spec = resolve_architecture(load_hf_config(source))
    return nnx.to_pure_dict(nnx.state(build_model(entry, spec, dtype, source)))


def _flat(tree: dict) -> dict:
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_f32_gguf_loads_to_exactly_the_params_of_its_safetensors_twin(llama):  # noqa: F811
    tmp, _, _, gguf_path = llama
    ours, twin = _flat(_params(str(gguf_path))), _flat(_params(str(tmp / "llama")))
    assert ours.keys() == twin.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], twin[name], err_msg=name)


def test_q8_0_gguf_params_are_within_quantization_error(llama):  # noqa: F811
    tmp, config, tensors, _ = llama
    q8 = write_gguf(tmp / "q8.gguf", "llama", config, tensors, quant="Q8_0")
    ours, twin = _flat(_params(str(q8))), _flat(_params(str(tmp / "llama")))
    for name in ours:
        scale = np.abs(twin[name]).max()
        assert np.abs(ours[name] - twin[name]).max() <= scale / 127 * 1.01 + 1e-7, name


def test_bfloat16_dtype_casts_weights(tmp_path):
    make_tiny_checkpoint("llama", tmp_path)
    params = _flat(_params(str(tmp_path), "bfloat16"))
    assert {str(v.dtype) for v in params.values()} == {"bfloat16"}


@pytest.fixture
def checkpoint_dir(tmp_path):
    make_tiny_checkpoint("qwen2", tmp_path)
    return tmp_path


def _expect_error(path, *fragments):
    with pytest.raises(ModelSourceError) as info:
        _params(str(path))
    for fragment in fragments:
        assert fragment in str(info.value)


def test_missing_tensor_names_the_tensor(checkpoint_dir):
    tensors = load_file(checkpoint_dir / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, checkpoint_dir / "model.safetensors")
    _expect_error(checkpoint_dir, "model.layers.1.mlp.up_proj.weight", "lacks")


def test_shape_mismatch_names_file_tensor_and_shapes(checkpoint_dir):
    tensors = load_file(checkpoint_dir / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((3, 64), np.float32)
    save_file(tensors, checkpoint_dir / "model.safetensors")
    _expect_error(checkpoint_dir, "model.safetensors", "k_proj.weight", "(3, 64)")


def test_corrupt_safetensors_file_is_named(checkpoint_dir):
    (checkpoint_dir / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    _expect_error(checkpoint_dir, "model.safetensors", "cannot read")


def test_sharded_checkpoint_with_missing_shard_is_named(checkpoint_dir):
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                            "model.norm.weight": "model-00002-of-00002.safetensors"}}
    (checkpoint_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.move(checkpoint_dir / "model.safetensors", checkpoint_dir / "model-00001-of-00002.safetensors")
    _expect_error(checkpoint_dir, "model-00002-of-00002.safetensors", "missing")


def test_sharded_checkpoint_loads_like_a_single_file(checkpoint_dir):
    whole = _flat(_params(str(checkpoint_dir)))
    tensors = load_file(checkpoint_dir / "model.safetensors")
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, checkpoint_dir / file)
    (checkpoint_dir / "model.safetensors").unlink()
    weight_map = {n: f for f, part in halves.items() for n in part}
    (checkpoint_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    sharded = _flat(_params(str(checkpoint_dir)))
    for name in whole:
        np.testing.assert_array_equal(whole[name], sharded[name])


def test_pickle_checkpoints_are_refused(checkpoint_dir):
    (checkpoint_dir / "model.safetensors").rename(checkpoint_dir / "pytorch_model.bin")
    _expect_error(checkpoint_dir, "no *.safetensors", "pickle")


def test_nonexistent_path_and_uncached_hub_id_fail_at_once(tmp_path):
    with pytest.raises(ModelSourceError, match="no such file"):
        resolve_model_source(str(tmp_path / "nope"))
    with pytest.raises(ModelSourceError, match="local Hugging Face cache"):
        resolve_model_source("some-org/definitely-not-cached-model")


def test_directory_without_config_is_named(tmp_path):
    with pytest.raises(ModelSourceError, match="no config.json"):
        resolve_model_source(str(tmp_path))


def test_unknown_architecture_names_the_supported_ones(checkpoint_dir):
    config = json.loads((checkpoint_dir / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (checkpoint_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="LlamaForCausalLM.*Qwen3ForCausalLM"):
        _params(str(checkpoint_dir))


def test_each_source_format_gets_its_own_loader(llama, tmp_path):  # noqa: F811
    from vllm_jax.cli import main
    from vllm_jax.model_loader.gguf_file import GGUFCheckpoint
    from vllm_jax.model_loader.loader import weight_loader_for
    from vllm_jax.model_loader.orbax_io import ConvertedLoader
    from vllm_jax.model_loader.random_weights import RandomWeights
    from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint
    from vllm_jax.model_loader.tensor_loader import TensorLoader

    gguf_path = llama[3]
    make_tiny_checkpoint("qwen3", tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "converted")]) == 0
    readers = {"safetensors": SafetensorsCheckpoint, "gguf": GGUFCheckpoint}
    for kind, path in (("safetensors", tmp_path / "hf"), ("gguf", gguf_path)):
        loader = weight_loader_for(resolve_model_source(str(path)))
        assert isinstance(loader, TensorLoader) and isinstance(loader.checkpoint, readers[kind]), kind
    assert isinstance(weight_loader_for(resolve_model_source(str(tmp_path / "converted"))), ConvertedLoader)
    assert isinstance(weight_loader_for(None, seed=3), RandomWeights)
    # the converted directory restores exactly the params its source loads
    converted, direct = _flat(_params(str(tmp_path / "converted"))), _flat(_params(str(tmp_path / "hf")))
    assert converted.keys() == direct.keys()
    for name in direct:
        np.testing.assert_array_equal(converted[name], direct[name], err_msg=name)

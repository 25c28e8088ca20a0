"""gpt-oss checkpoints with MXFP4 experts, as published (model_loader/mxfp4_checkpoint.py): a tiny float gpt-oss
whose experts are quantized here by our own encoder (nearest e2m1 under one e8m0 scale per 32 inputs) and saved
in the published layout (`*_blocks` / `*_scales`, quant_method mxfp4). The engine's logits must equal
transformers' on the same dequantized weights within 1e-4; malformed blocks / scales are a clear error."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from tests.helpers.mxfp4 import make_mxfp4_checkpoint
from tests.helpers.parity import assert_logits_match_over_two_chunked_steps, ragged_sequences
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.model_loader.errors import ModelSourceError


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(float dir, MXFP4 dir): intermediate 64 so down_proj's inputs fill 32-wide groups."""
    root = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    make_tiny_checkpoint("gpt_oss", root / "float", seed=3, intermediate_size=64)
    return root / "float", make_mxfp4_checkpoint(root / "float", root / "mxfp4")


def test_mxfp4_experts_give_transformers_logits_on_the_dequantized_weights(checkpoints):
    from transformers import GptOssForCausalLM, Mxfp4Config

    float_dir, mx = checkpoints
    hf = GptOssForCausalLM.from_pretrained(mx, quantization_config=Mxfp4Config(dequantize=True),
                                           dtype=torch.float32).eval()
    original = load_file(str(float_dir / "model.safetensors"))
    for layer in (0, 2):
        got = hf.model.layers[layer].mlp.experts.gate_up_proj.detach().numpy()
        want = original[f"model.layers.{layer}.mlp.experts.gate_up_proj"]
        assert got.shape == want.shape and 0 < np.abs(got - want).max() < 0.2 * np.abs(want).max()  # quantized
    assert_logits_match_over_two_chunked_steps(hf, mx, ragged_sequences())


def test_a_device_slice_reads_the_same_values_as_the_whole_tensor(checkpoints):
    """Sharded loading reads experts / input rows / output columns ranges (EP, TP): a slice that cuts a 32-input
    group in the middle equals the same slice of the whole dequantized tensor."""
    from vllm_jax.model_loader.mxfp4_checkpoint import Mxfp4Checkpoint
    from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint

    checkpoint = Mxfp4Checkpoint(SafetensorsCheckpoint(checkpoints[1]))
    name = "model.layers.1.mlp.experts.gate_up_proj"
    whole = checkpoint.read(name, ())
    assert checkpoint.shape(name) == whole.shape == (4, 64, 128) and name + "_blocks" not in checkpoint.names()
    index = (slice(1, 3), slice(16, 48), slice(5, 70))
    assert np.array_equal(checkpoint.read(name, index), whole[index])


@pytest.mark.parametrize("damage", ["scales_shape", "blocks_width", "no_scales"])
def test_malformed_blocks_or_scales_are_a_clear_error(checkpoints, tmp_path, damage):
    from vllm_jax.model_loader.mxfp4_checkpoint import Mxfp4Checkpoint
    from vllm_jax.model_loader.safetensors_checkpoint import SafetensorsCheckpoint

    _, mx = checkpoints
    tensors = load_file(str(mx / "model.safetensors"))
    name = "model.layers.1.mlp.experts.down_proj"
    if damage == "scales_shape":
        tensors[name + "_scales"] = tensors[name + "_scales"][:, :-1]
    elif damage == "blocks_width":
        tensors[name + "_blocks"] = tensors[name + "_blocks"][..., :8].copy()
    else:
        del tensors[name + "_scales"]
    bad = tmp_path / "bad"
    shutil.copytree(mx, bad)
    save_file(tensors, str(bad / "model.safetensors"))
    match = "has no" if damage == "no_scales" else r"do not match: expected blocks \[experts, out, in / 32, 16\]"
    with pytest.raises(ModelSourceError, match=f"{name}.*{match}"):
        Mxfp4Checkpoint(SafetensorsCheckpoint(bad))

"""GGUF files of Gemma 4 with the MoE block (gemma-4-26B-A4B; models/gemma4/gguf_moe.py): the tiny MoE
checkpoint (tests/helpers/gemma4_models.py MOE: 4 experts of 32, top 2, router scales and the block's norms
randomized) written as llama.cpp's converter would (router as `ffn_gate_inp` with its `.scale`, per_expert_scale as
`ffn_down_exps.scale`, the fused `ffn_gate_up_exps` and `ffn_down_exps` stacks as HF has them, the block's norms
unshifted, the expert_* keys), then read back: the HF config's Gemma4Spec, every tensor bit-equal, the engine's
logits within 1e-5 of the HF checkpoint's (and of transformers over a Q8_0 file's dequantized weights); a file
that breaks the block is refused by name."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers import AutoConfig

from tests.engine.test_gguf_gemma4 import _hf_logits, write_gemma4_gguf
from tests.helpers.gemma4_models import MOE, make_tiny_gemma4
from tests.helpers.quantized_models import prompt_logits, quant_runner, relative_error
from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.gguf_file import iter_gguf_tensors, read_gguf_config
from vllm_jax.models.gemma4.spec import gemma4_spec_from_hf_config


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(HF dir, its float32 GGUF, the torch model): the MoE block beside k_eq_v, KV sharing, the double-wide MLP
    and PLE."""
    tmp = tmp_path_factory.mktemp("gemma4_moe_gguf")
    model = make_tiny_gemma4(tmp / "hf", seed=5, **MOE)
    return tmp / "hf", write_gemma4_gguf(tmp / "f32.gguf", tmp / "hf"), model


def test_config_gives_the_hf_configs_spec(checkpoint):
    hf_dir, path, _ = checkpoint
    got, want = read_gguf_config(str(path)), AutoConfig.from_pretrained(hf_dir)
    assert gemma4_spec_from_hf_config(got) == gemma4_spec_from_hf_config(want)
    for key in ("enable_moe_block", "num_experts", "top_k_experts", "moe_intermediate_size", "intermediate_size"):
        assert getattr(got, key) == getattr(want, key), key


def test_f32_tensors_equal_the_hf_tensors(checkpoint):
    """The router, its scales, the stacked experts and the block's norms under their HF names, as they were."""
    hf_dir, path, _ = checkpoint
    want = {k: v for k, v in load_file(str(hf_dir / "model.safetensors")).items() if k != "lm_head.weight"}
    got = dict(iter_gguf_tensors(str(path)))
    assert set(got) == set(want)
    assert "model.layers.0.experts.gate_up_proj" in got and "model.layers.4.router.per_expert_scale" in got
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


def test_f32_gguf_gives_the_hf_checkpoints_logits(checkpoint):
    hf_dir, path, _ = checkpoint
    reference = prompt_logits(quant_runner(hf_dir, None))
    assert np.abs(reference).max() > 0.1
    np.testing.assert_allclose(prompt_logits(quant_runner(path, None)), reference, atol=1e-5, rtol=0)


def test_q8_0_gives_the_hf_model_of_its_dequantized_weights(checkpoint, tmp_path):
    """Expert stacks quantized along their input dim (the router kept F32, as llama.cpp does)."""
    hf_dir, _, model = checkpoint
    q8 = write_gemma4_gguf(tmp_path / "q8.gguf", hf_dir, quant="Q8_0")
    reader = gguf.GGUFReader(str(q8))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.ffn_gate_up_exps.weight"] == types["blk.0.ffn_down_exps.weight"] == "Q8_0"
    reference = _hf_logits(model)
    dequantized = dict(iter_gguf_tensors(str(q8)))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                if name in dequantized:
                    tensor.copy_(torch.from_numpy(dequantized[name]))
        want = _hf_logits(model)
    finally:
        model.load_state_dict(state)
    assert relative_error(want, reference) > 1e-3  # really quantized
    np.testing.assert_allclose(prompt_logits(quant_runner(q8, None)), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("omit, extra, message", [
    (("blk.2.ffn_down_exps.weight",), None, "lacks tensor blk.2.ffn_down_exps.weight"),
    (("blk.0.ffn_down_exps.scale",), None, "lacks tensor blk.0.ffn_down_exps.scale"),
    ((), lambda w: w.add_tensor("blk.1.ffn_gate_exps.weight", np.zeros((4, 32, 64), np.float32)),
     "blk.1.ffn_gate_exps.weight: Gemma 4's experts are one fused ffn_gate_up_exps"),
    ((), lambda w: w.add_tensor("blk.1.ffn_gate_inp.bias", np.zeros((4,), np.float32)),
     "blk.1.ffn_gate_inp.bias is no tensor of Gemma 4's MoE block"),
])
def test_a_broken_moe_block_is_refused_by_name(checkpoint, tmp_path, omit, extra, message):
    hf_dir = checkpoint[0]
    path = str(write_gemma4_gguf(tmp_path / "bad.gguf", hf_dir, extra=extra, omit=omit))
    with pytest.raises(ModelSourceError, match=message):
        read_gguf_config(path)
        dict(iter_gguf_tensors(path))


@pytest.mark.parametrize("key", ["expert_used_count", "expert_feed_forward_length"])
def test_expert_keys_are_required(checkpoint, tmp_path, key):
    path = write_gemma4_gguf(tmp_path / "bad.gguf", checkpoint[0], omit=(key,))
    with pytest.raises(ModelSourceError, match=f"lacks gemma4.{key}"):
        read_gguf_config(str(path))

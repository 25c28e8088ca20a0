"""GGUF files of Gemma 2, Gemma 3, Phi-3, Granite and OLMo 2 (model_loader/gguf_file/families.py): a tiny random
HF checkpoint is written out as llama.cpp's converter would (its names, Gemma's norms + 1, Granite's q/k rows
permuted, Phi-3's fused projections and long-rope factor tensors, each family's metadata keys), then run through
the engine. A float32 GGUF must give the HF checkpoint's logits through the same engine within 1e-5; a Q8_0 GGUF
kept quantized (--quantization gguf) must give the dequantizing loader's logits within a relative 1e-5."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file
from transformers import AutoConfig

from tests.engine.test_gguf import llama_cpp_permute
from tests.helpers.family_models import make_family_checkpoint
from tests.helpers.gguf_writing import add_tensor, finish_gguf
from tests.helpers.quantized_models import prompt_logits, quant_runner, relative_error
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.model_loader.gguf_file import read_gguf_config

GLOBAL = {"model.embed_tokens": "token_embd", "lm_head": "output", "model.norm": "output_norm"}
BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
GEMMA_BLOCK = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}
BLOCK_BY_ARCH = {"gemma2": GEMMA_BLOCK, "gemma3": GEMMA_BLOCK,
                 "olmo2": {"post_attention_layernorm": "post_attention_norm",
                           "post_feedforward_layernorm": "post_ffw_norm"},
                 "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}}
# Gemma's query scale must be what llama.cpp derives (head_dim); Gemma 3 keeps one sliding and one global layer
CHECKPOINTS = {
    "gemma2": lambda path: make_tiny_checkpoint("gemma2", path, query_pre_attn_scalar=16),
    "gemma3": lambda path: make_tiny_checkpoint("gemma3", path, query_pre_attn_scalar=32),
    "phi3": lambda path: make_family_checkpoint("phi3", path),
    "granite": lambda path: make_family_checkpoint("granite", path),
    "olmo2": lambda path: make_family_checkpoint("olmo2", path),
}


def write_family_gguf(path: Path, arch: str, hf_dir: Path, quant: str | None = None) -> Path:
    """The GGUF llama.cpp's converter writes for this checkpoint (2-D weights in `quant`, the rest F32)."""
    config = AutoConfig.from_pretrained(hf_dir)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    rope = config.rope_parameters
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if arch != "gemma2":  # Gemma 2's converter writes no rope base (llama.cpp's default 10000 applies)
        writer.add_rope_freq_base(rope.get("full_attention", rope)["rope_theta"])
    if arch.startswith("gemma"):
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_sliding_window(config.sliding_window)
        if config.final_logit_softcapping:
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
    if arch == "gemma3":  # one global layer in two (llama.cpp's default period is 6); linear scaling on it
        writer.add_uint32("gemma3.attention.sliding_window_pattern", 2)
        writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["full_attention"]["factor"])
    if arch == "phi3":
        writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_sliding_window(0)
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    if arch == "granite":
        writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
        writer.add_attention_scale(config.attention_multiplier)
        writer.add_embedding_scale(config.embedding_multiplier)
        writer.add_residual_scale(config.residual_multiplier)
        writer.add_logit_scale(config.logits_scaling)
    names = {**BLOCK, **BLOCK_BY_ARCH.get(arch, {})}
    for name, array in tensors.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        stem, kind = name.rsplit(".", 1)
        if stem in GLOBAL:
            gguf_name = f"{GLOBAL[stem]}.{kind}"
        else:
            layer, sub = stem.removeprefix("model.layers.").split(".", 1)
            gguf_name = f"blk.{layer}.{names[sub]}.{kind}"
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            array = array + np.float32(1.0)
        if arch == "granite" and "q_proj" in name:
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif arch == "granite" and "k_proj" in name:
            array = llama_cpp_permute(array, config.num_key_value_heads)
        add_tensor(writer, gguf_name, array, quant if array.ndim == 2 else None)
    return finish_gguf(writer, path)


def _logits(path: Path, quantization: str | None = None) -> np.ndarray:
    return prompt_logits(quant_runner(path, quantization))


@pytest.mark.parametrize("arch", list(CHECKPOINTS))
def test_family_gguf_gives_the_hf_checkpoints_logits(tmp_path, arch):
    hf_dir = tmp_path / "hf"
    CHECKPOINTS[arch](hf_dir)
    f32 = write_family_gguf(tmp_path / "f32.gguf", arch, hf_dir)
    config, want_config = read_gguf_config(str(f32)), AutoConfig.from_pretrained(hf_dir)
    assert config.architectures == want_config.architectures
    reference = _logits(hf_dir)
    assert np.abs(reference).max() > 0.1
    np.testing.assert_allclose(_logits(f32), reference, atol=1e-5, rtol=0)
    # Q8_0 blocks kept on the device compute the dequantizing loader's model
    q8 = write_family_gguf(tmp_path / "q8.gguf", arch, hf_dir, quant="Q8_0")
    dequantized = _logits(q8)
    assert relative_error(_logits(q8, "gguf"), dequantized) < 1e-5
    assert relative_error(dequantized, reference) > 1e-5  # really quantized

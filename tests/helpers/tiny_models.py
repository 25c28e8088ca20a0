"""Tiny random checkpoints built from transformers configs (never downloaded), plus a byte-level tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

VOCAB_SIZE = 320
EOS_ID = 2

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "llama3_rope": (LlamaConfig, LlamaForCausalLM, dict(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}, rope_theta=500000.0, tie_word_embeddings=True)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=7)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(use_sliding_window=True, sliding_window=6, max_window_layers=1,
                                                   tie_word_embeddings=True)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=32)),
}

# MoE models (tests/test_moe.py): 4 experts, top-2; make_tiny_checkpoint takes these names too.
MOE_ARCHS = {
    "mixtral": (MixtralConfig, MixtralForCausalLM, dict(num_local_experts=4, num_experts_per_tok=2,
                                                        intermediate_size=96, sliding_window=7)),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(num_experts=4, num_experts_per_tok=2,
                                                            moe_intermediate_size=48, head_dim=32)),
    # a dense MLP layer between MoE layers, renormalized top-k, sliding window on every layer
    "qwen3_moe_mixed": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, head_dim=32, num_hidden_layers=3,
        mlp_only_layers=[1], norm_topk_prob=True, use_sliding_window=True, sliding_window=6)),
}


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Special tokens, the 256 byte tokens, and a few letters: any text encodes, decoding is byte-exact."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(256):
        vocab[f"<0x{i:02X}>"] = 3 + i
    for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz"):
        vocab[ch] = 259 + i
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    backend.decoder = decoders.ByteFallback()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def make_tiny_checkpoint(arch: str, path: Path, seed: int = 0, **overrides):
    """Save a random tiny model of `arch` (safetensors + tokenizer) to `path`; returns the torch model."""
    config_cls, model_cls, extra = {**ARCHS, **MOE_ARCHS}[arch]
    kwargs = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                  eos_token_id=EOS_ID, initializer_range=0.1, rms_norm_eps=1e-6)
    kwargs.update(extra)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval()
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return model


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()

"""Tiny random Gemma 4 text checkpoints (tests/engine/test_gemma4.py): 5 layers (sliding, sliding, full, sliding, full),
the last two KV-shared (layer 3 reads layer 1's cache, layer 4 layer 2's) with the double-wide MLP, head_dim 16 and
global_head_dim 32, PLE on, a final logit cap small enough to bend these logits, every norm and layer_scalar
randomized (transformers starts them at one). `MOE` adds the MoE block (tests/engine/test_gemma4_moe.py), its router
scales and norms randomized too."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

from tests.helpers.tiny_models import EOS_ID, VOCAB_SIZE, byte_tokenizer

LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]


# params transformers starts at one, randomized around it: norms (the MoE block's `..._layernorm_1/2` too),
# layer_scalar and the router's scales
_START_AT_ONE = ("norm.weight", "layernorm_1.weight", "layernorm_2.weight", "layer_scalar", "router.scale",
                 "per_expert_scale")
# the MoE block (tests/engine/test_gemma4_moe.py): 4 experts of 32, top 2, beside every layer's MLP
MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)


def gemma4_config(**overrides) -> Gemma4TextConfig:
    kwargs = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=96, num_hidden_layers=5,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                  num_global_key_value_heads=1, layer_types=LAYER_TYPES, sliding_window=6,
                  final_logit_softcapping=3.0, vocab_size_per_layer_input=VOCAB_SIZE, hidden_size_per_layer_input=8,
                  attention_k_eq_v=True, num_kv_shared_layers=2, use_double_wide_mlp=True,
                  max_position_embeddings=256, initializer_range=0.1, rms_norm_eps=1e-6, pad_token_id=0,
                  bos_token_id=1, eos_token_id=EOS_ID, architectures=["Gemma4ForCausalLM"])
    kwargs.update(overrides)
    return Gemma4TextConfig(**kwargs)


def make_tiny_gemma4(path: Path, seed: int = 0, **overrides) -> Gemma4ForCausalLM:
    """Save a random tiny Gemma 4 (safetensors + tokenizer) to `path`; returns the torch model."""
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(gemma4_config(**overrides)).eval()
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith(_START_AT_ONE):
                tensor.copy_(1.0 + torch.randn(tensor.shape) * 0.3)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return model

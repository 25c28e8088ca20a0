"""Tiny random checkpoints of the Granite, OLMo 2 and Phi-3 families (tests/test_family_*.py), built from
transformers configs like tests/helpers/tiny_models.py builds the Llama family's."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GraniteConfig, GraniteForCausalLM, Olmo2Config, Olmo2ForCausalLM, Phi3Config, Phi3ForCausalLM

from tests.helpers.tiny_models import EOS_ID, VOCAB_SIZE, byte_tokenizer

# LongRoPE: short and long factors per rotary frequency pair (head_dim 16 -> 8), a 64-token original context
# stretched to 256 (factor 4: attention factor sqrt(1 + ln 4 / ln 64))
PHI3_ORIGINAL_CONTEXT = 64
_SHORT = [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0]
_LONG = [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 14.0, 20.0]

FAMILIES = {
    # every multiplier away from 1, biases on
    "granite": (GraniteConfig, GraniteForCausalLM, dict(
        embedding_multiplier=3.0, attention_multiplier=0.3, residual_multiplier=0.7, logits_scaling=2.5,
        attention_bias=True, mlp_bias=True)),
    "olmo2": (Olmo2Config, Olmo2ForCausalLM, dict(rms_norm_eps=1e-6)),
    "phi3": (Phi3Config, Phi3ForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        original_max_position_embeddings=PHI3_ORIGINAL_CONTEXT, pad_token_id=0,
        rope_scaling={"rope_type": "longrope", "short_factor": _SHORT, "long_factor": _LONG})),
}


def make_family_checkpoint(family: str, path: Path, seed: int = 0, **overrides):
    """Save a random tiny `family` model (safetensors + byte tokenizer) to `path`; returns the torch model."""
    config_cls, model_cls, extra = FAMILIES[family]
    kwargs = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                  eos_token_id=EOS_ID, initializer_range=0.1, rms_norm_eps=1e-6, pad_token_id=0)
    kwargs.update(extra)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval()
    with torch.no_grad():  # norms start at 1: random ones make a wrong norm placement show in the logits
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return model

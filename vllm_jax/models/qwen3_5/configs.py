"""Qwen3.5's configs: tiny ones for its random test checkpoints (tests/helpers/tiny_models.py)."""

from __future__ import annotations

from vllm_jax.models.family import tiny

# three layers: gated DeltaNet, gated attention, gated DeltaNet (the real models repeat three DeltaNet layers and one
# attention layer); value heads twice the key heads, as in every Qwen3.5 size; a quarter of each head rotated
TINY = {"qwen3_5": tiny(
    "Qwen3_5ForCausalLM", model_type="qwen3_5_text", num_hidden_layers=3, head_dim=16,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.25},
    tie_word_embeddings=False, pad_token_id=0)}

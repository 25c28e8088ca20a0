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

# Qwen/Qwen3.5-27B's text config (the public model card's config.json, text_config): 64 layers, every fourth gated
# attention (16), 48 gated DeltaNet layers of 16 key / 48 value heads of 128.
QWEN3_5_27B = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 5120,
    "intermediate_size": 17408, "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4,
    "head_dim": 256, "vocab_size": 248320, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
    "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)],
    "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
}


def cut_qwen3_5_config(config: dict, layers: int) -> dict:
    """A cut keeps the layer kinds' pattern: the first `layers` of `layer_types`, with an attention layer last so a
    cut of 2 or more has both kinds."""
    kinds = list(config["layer_types"][:layers])
    if layers >= 2 and "full_attention" not in kinds:
        kinds[-1] = "full_attention"
    return {"layer_types": kinds}

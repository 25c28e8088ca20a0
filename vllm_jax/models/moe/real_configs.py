"""The family's compile-check configs at real sizes (aot/model_configs.py writes them): the fields the engine reads
from each public model card's config.json; nothing is downloaded."""

from __future__ import annotations

# Qwen/Qwen3-30B-A3B's config.json: 128 experts, 8 per token, every layer sparse.
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True, "vocab_size": 151936,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

# mistralai/Mixtral-8x7B-v0.1's config.json: 8 experts, 2 per token.
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": None, "hidden_act": "silu",
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

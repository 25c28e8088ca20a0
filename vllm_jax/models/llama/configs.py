"""The family's configs: at real sizes for the compile check (aot/model_configs.py writes them; the fields the engine
reads from each public model card's config.json, nothing downloaded), and tiny ones for its random test
checkpoints (tests/helpers/tiny_models.py)."""

from __future__ import annotations

from vllm_jax.models.family import tiny

# meta-llama/Llama-3.1-8B's config.json (the public model card's file), the fields the engine reads.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}

# Qwen/Qwen3-8B's config.json.
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

# tiny random checkpoints (the family tests): llama3 rope scaling with tied embeddings, Mistral's window, Qwen2's
# window on its first layer only, Qwen3's wider heads
TINY = {
    "llama": tiny("LlamaForCausalLM"),
    "llama3_rope": tiny("LlamaForCausalLM", rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}, rope_theta=500000.0, tie_word_embeddings=True),
    "mistral": tiny("MistralForCausalLM", sliding_window=7),
    "qwen2": tiny("Qwen2ForCausalLM", use_sliding_window=True, sliding_window=6, max_window_layers=1,
                  tie_word_embeddings=True),
    "qwen3": tiny("Qwen3ForCausalLM", head_dim=32),
}

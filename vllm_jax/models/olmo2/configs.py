"""The family's configs: at real sizes for the compile check (aot/model_configs.py writes them; the fields the engine
reads from each public model card's config.json, nothing downloaded), and tiny ones for its random test
checkpoints (tests/helpers/tiny_models.py)."""

from __future__ import annotations

from vllm_jax.models.family import tiny

# allenai/OLMo-2-1124-7B's config.json: post-norms, whole-projection q/k norms, no GQA.
OLMO2_7B = {
    "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100352,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

TINY = {"olmo2": tiny("Olmo2ForCausalLM", pad_token_id=0)}  # a tiny random checkpoint

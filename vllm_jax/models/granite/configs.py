"""The family's configs: at real sizes for the compile check (aot/model_configs.py writes them; the fields the engine
reads from each public model card's config.json, nothing downloaded), and tiny ones for its random test
checkpoints (tests/helpers/tiny_models.py)."""

from __future__ import annotations

from vllm_jax.models.family import tiny

# ibm-granite/granite-3.0-8b-instruct's config.json: the four Granite multipliers, tied embeddings.
GRANITE_3_8B = {
    "architectures": ["GraniteForCausalLM"], "model_type": "granite", "hidden_size": 4096,
    "intermediate_size": 12800, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 49155, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True,
    "embedding_multiplier": 12.0, "attention_multiplier": 0.0078125, "residual_multiplier": 0.22,
    "logits_scaling": 16.0, "torch_dtype": "bfloat16",
}

# a tiny random checkpoint: every multiplier away from 1, biases on
TINY = {
    "granite": tiny("GraniteForCausalLM", embedding_multiplier=3.0, attention_multiplier=0.3, residual_multiplier=0.7,
                    logits_scaling=2.5, attention_bias=True, mlp_bias=True, pad_token_id=0),
}

"""The family's configs: at real sizes for the compile check (aot/model_configs.py writes them; the fields the engine
reads from each public model card's config.json, nothing downloaded), and tiny ones for its random test
checkpoints (tests/helpers/tiny_models.py)."""

from __future__ import annotations

from vllm_jax.models.family import tiny

# microsoft/Phi-3-mini-128k-instruct's config.json: head_dim 96, fused qkv / gate_up tensors, LongRoPE. The 48
# short / long factors here are placeholders (1.0 and a ramp), not the card's values: a compile check depends on
# their count, not their values.
PHI3_MINI_128K = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "sliding_window": 262144, "hidden_act": "silu", "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48,
                                                "long_factor": [1.0 + i for i in range(48)]},
}

# a tiny random checkpoint with LongRoPE: short and long factors per rotary frequency pair (head_dim 16 -> 8), a
# 64-token original context stretched to 256 (factor 4: attention factor sqrt(1 + ln 4 / ln 64))
TINY_ORIGINAL_CONTEXT = 64
TINY = {
    "phi3": tiny("Phi3ForCausalLM", original_max_position_embeddings=TINY_ORIGINAL_CONTEXT, pad_token_id=0,
                 rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0],
                               "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 14.0, 20.0]}),
}

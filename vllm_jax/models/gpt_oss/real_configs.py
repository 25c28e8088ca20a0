"""The family's compile-check configs at real sizes (aot/model_configs.py writes them): the fields the engine reads
from each public model card's config.json; nothing is downloaded."""

from __future__ import annotations

# openai/gpt-oss-20b's config.json without its quantization_config (the published MXFP4 experts are dequantized to
# the model dtype at load, so the compiled programs are the float layout's) and without layer_types, which transformers
# derives as the published alternation (sliding on even layers, full on odd) for any --layers.
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
    "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 150000, "sliding_window": 128,
    "attention_bias": True, "swiglu_limit": 7.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "initial_context_length": 4096, "eos_token_id": 200002, "pad_token_id": 199999, "torch_dtype": "bfloat16",
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 4096},
}

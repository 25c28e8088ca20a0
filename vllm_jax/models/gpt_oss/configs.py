"""The family's configs: at real sizes for the compile check (aot/model_configs.py writes them; the fields the engine
reads from each public model card's config.json, nothing downloaded), and tiny ones for its random test
checkpoints (tests/helpers/tiny_models.py)."""

from __future__ import annotations

from vllm_jax.models.family import tiny

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

# a tiny random checkpoint: sliding window on layers 0 and 2, full on 1; YaRN rope; a SwiGLU limit low enough to
# clamp often
TINY = {
    "gpt_oss": tiny("GptOssForCausalLM", num_local_experts=4, num_experts_per_tok=2, intermediate_size=48,
                    head_dim=16, num_hidden_layers=3, sliding_window=5, swiglu_limit=0.5, rope_parameters={
                        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                        "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64}),
}

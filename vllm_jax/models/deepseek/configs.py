"""The family's configs: at real sizes for the compile check (aot/model_configs.py writes them; the fields the engine
reads from each public model card's config.json, nothing downloaded), and tiny ones for its random test
checkpoints (tests/helpers/tiny_models.py)."""

from __future__ import annotations

from vllm_jax.models.family import tiny

# deepseek-ai/DeepSeek-V3's config.json: MLA (q LoRA 1536, kv LoRA 512, 128 heads), 256 experts in 8 groups, 8
# per token, 3 dense layers, YaRN rope (factor 40).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3, "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "vocab_size": 129280,
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
}

# tiny random checkpoints: 8 experts in 4 groups, top-2 of the best 2 groups, a dense first layer, shared experts
# (K/V heads = heads: transformers repeats its expanded K/V by heads / kv_heads). V3: q LoRA, sigmoid + correction
# bias; V2: plain q_proj, softmax
_MLA = dict(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, moe_intermediate_size=32,
            n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1, n_group=4, topk_group=2,
            num_key_value_heads=4)
TINY = {
    "deepseek_v3": tiny("DeepseekV3ForCausalLM", **_MLA, q_lora_rank=48, n_shared_experts=1,
                        routed_scaling_factor=2.5, norm_topk_prob=True, num_hidden_layers=3),
    "deepseek_v2": tiny("DeepseekV2ForCausalLM", **_MLA, q_lora_rank=None, n_shared_experts=2,
                        routed_scaling_factor=1.5, topk_method="group_limited_greedy"),
}

"""HF config.json files of well-known shapes, written locally (nothing is downloaded), for compile checks of real
sizes: `python -m vllm_jax.aot.model_configs OUT_DIR [--model NAME] [--layers N]` writes one of `MODELS` (default
Llama-3.1-8B), optionally with fewer layers (a two-layer model has every per-layer shape of the full one and
compiles in a fraction of the time). Each dict holds the fields the engine reads from the public model card's
config.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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
# google/gemma-2-9b's config.json: sliding (4096) and global layers alternate, both logit soft caps.
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
    "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "query_pre_attn_scalar": 256, "vocab_size": 256000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
# google/gemma-3-27b-it's text_config as a Gemma3ForCausalLM: five sliding (1024, rope base 10k) layers per global
# one (base 1M, linear scaling 8), query_pre_attn_scalar 168 = hidden / heads.
GEMMA3_27B = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 5376,
    "intermediate_size": 21504, "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
    "head_dim": 128, "query_pre_attn_scalar": 168, "vocab_size": 262208, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 1024, "sliding_window_pattern": 6,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}
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
# ibm-granite/granite-3.0-8b-instruct's config.json: the four Granite multipliers, tied embeddings.
GRANITE_3_8B = {
    "architectures": ["GraniteForCausalLM"], "model_type": "granite", "hidden_size": 4096,
    "intermediate_size": 12800, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 49155, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True,
    "embedding_multiplier": 12.0, "attention_multiplier": 0.0078125, "residual_multiplier": 0.22,
    "logits_scaling": 16.0, "torch_dtype": "bfloat16",
}
# allenai/OLMo-2-1124-7B's config.json: post-norms, whole-projection q/k norms, no GQA.
OLMO2_7B = {
    "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100352,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
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
# google/gemma-4-E4B's text_config as a Gemma4ForCausalLM (the fields as published for the E4B checkpoint: 42 layers,
# five sliding (512, head_dim 256) per full one (global_head_dim 512, proportional rope over a quarter of it), the
# last 18 layers KV-shared, per-layer-input embeddings of 256); no MoE block, values from their own projection.
GEMMA4_E4B = {
    "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "hidden_size": 2560,
    "intermediate_size": 10240, "num_hidden_layers": 42, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 256, "global_head_dim": 512, "vocab_size": 262144, "vocab_size_per_layer_input": 262144,
    "hidden_size_per_layer_input": 256, "num_kv_shared_layers": 18, "sliding_window": 512,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0,
    "use_double_wide_mlp": False, "attention_k_eq_v": False, "enable_moe_block": False,
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1000000.0}},
}
# google/gemma-4-26B-A4B's text_config as a Gemma4ForCausalLM. The numbers: 30 layers (five sliding, window 1024,
# per full one), hidden 2816, dense MLP 2112, 128 experts of 704 with top 8 beside it, 16 query heads, 8 KV heads of
# 256 on the sliding layers and 2 of 512 on the full ones with values from k_proj (attention_k_eq_v), no KV sharing,
# no per-layer inputs; as quoted (with the same values in each) by several public configs in the code index:
# mlx-community/gemma-4-26b-a4b-it-4bit's text_config, a model card's config.json (Gemma4ForConditionalGeneration)
# and a Go loader's test of the 26B text_config.
GEMMA4_26B_A4B = {
    "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "hidden_size": 2816,
    "intermediate_size": 2112, "num_hidden_layers": 30, "num_attention_heads": 16, "num_key_value_heads": 8,
    "num_global_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512, "vocab_size": 262144,
    "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "sliding_window": 1024,
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0,
    "use_double_wide_mlp": False, "attention_k_eq_v": True, "enable_moe_block": True, "num_experts": 128,
    "top_k_experts": 8, "moe_intermediate_size": 704, "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                           "rope_theta": 1000000.0}},
}
MODELS = {"llama-3.1-8b": LLAMA3_8B, "qwen3-8b": QWEN3_8B, "qwen3-30b-a3b": QWEN3_30B_A3B,
          "mixtral-8x7b": MIXTRAL_8X7B, "gemma-2-9b": GEMMA2_9B, "gemma-3-27b": GEMMA3_27B,
          "phi-3-mini-128k": PHI3_MINI_128K, "granite-3-8b": GRANITE_3_8B, "olmo-2-7b": OLMO2_7B,
          "gpt-oss-20b": GPT_OSS_20B, "deepseek-v3": DEEPSEEK_V3, "gemma-4-e4b": GEMMA4_E4B,
          "gemma-4-26b-a4b": GEMMA4_26B_A4B}
# Gemma's layer kinds as transformers derives them; a reduced model keeps its last layer global so that both
# kinds (Gemma 3: both rope tables) are in the compiled program.
_SLIDING_PERIOD = {"Gemma2ForCausalLM": 2, "Gemma3ForCausalLM": 6, "Gemma4ForCausalLM": 6}
# Gemma 4 with KV sharing cut to fewer layers keeps this many KV-shared layers (a sliding then a full one), each
# reading an earlier layer of its type
_GEMMA4_SHARED_KEPT = 2


def layer_types(config: dict, layers: int) -> list[str] | None:
    """`layer_types` for a Gemma config cut to `layers` layers (None for other families)."""
    period = _SLIDING_PERIOD.get(config["architectures"][0])
    if period is None:
        return None
    shared = _GEMMA4_SHARED_KEPT if _cut_gemma4(config, layers) else 0
    kinds = ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(layers - shared)]
    if layers < config["num_hidden_layers"]:
        kinds[-1] = "full_attention"
    return kinds + ["sliding_attention", "full_attention"][:shared]


def _cut_gemma4(config: dict, layers: int) -> bool:
    """A Gemma 4 with KV-shared layers cut to fewer layers (26B-A4B has none to keep)."""
    return (config["architectures"][0] == "Gemma4ForCausalLM" and layers < config["num_hidden_layers"]
            and config.get("num_kv_shared_layers", 0) > 0)


def write_config(directory: str | Path, config: dict | None = None, **overrides) -> Path:
    """`config` (default: Llama-3.1-8B's) with `overrides` as directory/config.json; -> the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**(config or LLAMA3_8B), **overrides}, indent=1) + "\n")
    return directory


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--model", choices=sorted(MODELS), default="llama-3.1-8b")
    parser.add_argument("--layers", type=int, default=None, help="default: the model's own")
    ns = parser.parse_args(argv)
    config = MODELS[ns.model]
    layers = ns.layers or config["num_hidden_layers"]
    kinds = layer_types(config, layers)
    extra = {} if kinds is None else {"layer_types": kinds}
    if _cut_gemma4(config, layers):
        extra["num_kv_shared_layers"] = _GEMMA4_SHARED_KEPT
    print(write_config(ns.out_dir, config, num_hidden_layers=layers, **extra) / "config.json")


if __name__ == "__main__":
    main()

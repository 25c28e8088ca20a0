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
# deepseek-ai/DeepSeek-V3's config.json without its YaRN rope scaling (not supported yet; the default rope has
# the same shapes): MLA (q LoRA 1536, kv LoRA 512, 128 heads), 256 experts in 8 groups, 8 per token, 3 dense layers.
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3, "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "vocab_size": 129280,
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
MODELS = {"llama-3.1-8b": LLAMA3_8B, "qwen3-8b": QWEN3_8B, "qwen3-30b-a3b": QWEN3_30B_A3B,
          "mixtral-8x7b": MIXTRAL_8X7B, "deepseek-v3": DEEPSEEK_V3}


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
    print(write_config(ns.out_dir, config, num_hidden_layers=layers) / "config.json")


if __name__ == "__main__":
    main()

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
# openai/gpt-oss-20b's config.json without its quantization_config (the published experts are MXFP4, not built
# here: this describes the float layout save_pretrained writes) and without layer_types, which transformers
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
MODELS = {"llama-3.1-8b": LLAMA3_8B, "qwen3-8b": QWEN3_8B, "qwen3-30b-a3b": QWEN3_30B_A3B,
          "mixtral-8x7b": MIXTRAL_8X7B, "gpt-oss-20b": GPT_OSS_20B}


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

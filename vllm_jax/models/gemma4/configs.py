"""The family's configs: at real sizes for the compile check (aot/model_configs.py writes them; the fields the engine
reads from each public model card's config.json, nothing downloaded), and tiny ones for its random test
checkpoints (tests/helpers/tiny_models.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_jax.models.family import tiny
from vllm_jax.models.gemma.configs import sliding_layer_types

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

# a config with KV sharing cut to fewer layers keeps this many KV-shared layers (a sliding then a full one), each
# reading an earlier layer of its type
_SHARED_KEPT = 2


def cut_gemma4_config(config: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """Five sliding layers per full one, the last unshared one full; 26B-A4B has no KV-shared layers to keep."""
    if layers < config["num_hidden_layers"] and config.get("num_kv_shared_layers", 0) > 0:
        return {"layer_types": sliding_layer_types(config, layers, 6, _SHARED_KEPT),
                "num_kv_shared_layers": _SHARED_KEPT}
    return {"layer_types": sliding_layer_types(config, layers, 6)}

# a tiny random checkpoint: 5 layers (sliding, sliding, full, sliding, full), the last two KV-shared (layer 3 reads
# layer 1's cache, layer 4 layer 2's) with the double-wide MLP, head_dim 16 and global_head_dim 32, per-layer inputs
# on, a final logit cap small enough to bend these logits; and the same with the MoE block (4 experts of 32, top 2)
TINY_LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]
TINY_MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
_TINY = tiny("Gemma4ForCausalLM", intermediate_size=96, num_hidden_layers=5, head_dim=16, global_head_dim=32,
             num_global_key_value_heads=1, layer_types=TINY_LAYER_TYPES, sliding_window=6, final_logit_softcapping=3.0,
             vocab_size_per_layer_input=320, hidden_size_per_layer_input=8, attention_k_eq_v=True,
             num_kv_shared_layers=2, use_double_wide_mlp=True, pad_token_id=0)
TINY = {"gemma4": _TINY, "gemma4_moe": {**_TINY, **TINY_MOE}}

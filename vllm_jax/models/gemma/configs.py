"""The family's configs: at real sizes for the compile check (aot/model_configs.py writes them; the fields the engine
reads from each public model card's config.json, nothing downloaded), and tiny ones for its random test
checkpoints (tests/helpers/tiny_models.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_jax.models.family import tiny

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

# Gemma's layer kinds as transformers derives them: every n-th layer global
_SLIDING_PERIOD = {"Gemma2ForCausalLM": 2, "Gemma3ForCausalLM": 6}


def sliding_layer_types(config: Mapping[str, Any], layers: int, period: int, shared: int = 0) -> list[str]:
    """`layer_types` of a config cut to `layers` layers: its last unshared layer kept global so that both kinds
    (Gemma 3: both rope tables) are in the compiled program; `shared` KV-shared layers (Gemma 4) after it, a
    sliding then a full one."""
    kinds = ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(layers - shared)]
    if layers < config["num_hidden_layers"]:
        kinds[-1] = "full_attention"
    return kinds + ["sliding_attention", "full_attention"][:shared]


def cut_gemma_config(config: Mapping[str, Any], layers: int) -> dict[str, Any]:
    return {"layer_types": sliding_layer_types(config, layers, _SLIDING_PERIOD[config["architectures"][0]])}

# tiny random checkpoints: a sliding layer then a global one, query_pre_attn_scalar != head_dim, caps small enough
# to bend these logits; Gemma 3 with its own local rope base and linear scaling on the global layers
TINY = {
    "gemma2": tiny("Gemma2ForCausalLM", head_dim=16, query_pre_attn_scalar=24, sliding_window=6,
                   attn_logit_softcapping=1.5, final_logit_softcapping=3.0, hidden_activation="gelu_pytorch_tanh",
                   pad_token_id=0),
    "gemma3": tiny("Gemma3ForCausalLM", head_dim=32, query_pre_attn_scalar=24, sliding_window=6,
                   final_logit_softcapping=3.0, pad_token_id=0, layer_types=["sliding_attention", "full_attention"],
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}}),
}

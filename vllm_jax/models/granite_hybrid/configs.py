"""Granite 4.0-H's configs: at real size for the compile check, tiny for its random test checkpoints."""

from __future__ import annotations

from vllm_jax.models.family import tiny

# three layers: Mamba2, attention, Mamba2 (Granite 4.0-H interleaves a few attention layers among many Mamba2 ones);
# no position embedding, as the released models; the Granite multipliers away from 1 so that a missed one shows
_TINY_FIELDS = dict(
    model_type="granitemoehybrid", num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"],
    num_local_experts=0, shared_intermediate_size=96, mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16,
    mamba_d_head=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, mamba_conv_bias=True,
    mamba_proj_bias=False, embedding_multiplier=2.0, attention_multiplier=0.3, residual_multiplier=0.5,
    logits_scaling=2.0, tie_word_embeddings=False, pad_token_id=0)
TINY = {"granite_4_h": tiny("GraniteMoeHybridForCausalLM", **_TINY_FIELDS),
        "granite_4_h_rope": tiny("GraniteMoeHybridForCausalLM", **_TINY_FIELDS, position_embedding_type="rope")}

# ibm-granite/granite-4.0-h-350m's config.json: 32 layers, 4 of them attention; no position embedding
_M, _A = "mamba", "attention"
GRANITE_4_H_350M = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 768,
    "intermediate_size": 2048, "num_hidden_layers": 32, "num_attention_heads": 12, "num_key_value_heads": 4,
    "vocab_size": 100352, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "layer_types": [_M] * 10 + [_A, _M, _M, _A] + [_M] * 3 + [_A] + [_M] * 9 + [_A] + [_M] * 4,
    "num_local_experts": 0, "num_experts_per_tok": 0, "shared_intermediate_size": 2048,
    "mamba_n_heads": 48, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_head": 32, "mamba_d_conv": 4,
    "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
    "position_embedding_type": "nope", "rope_theta": 10000, "attention_bias": False, "embedding_multiplier": 12.0,
    "attention_multiplier": 0.015625, "residual_multiplier": 0.246, "logits_scaling": 3.0,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}


def cut_granite_hybrid_config(config: dict, layers: int) -> dict:
    """A cut keeps both kinds: the first `layers` layer types with an attention layer last (2 layers or more)."""
    kinds = list(config["layer_types"][:layers])
    if layers >= 2 and "attention" not in kinds:
        kinds[-1] = "attention"
    return {"layer_types": kinds}

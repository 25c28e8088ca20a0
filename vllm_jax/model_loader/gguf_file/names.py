"""GGUF tensor names -> HF names, shared by every family's mapping: llama's names, and the block names other
families give another meaning. A leaf module, so that the family modules (gemma4.py, moe_families.py) and
tensors.py can all read it without importing each other."""

from __future__ import annotations

# model-level tensors (".weight" / ".bias" appended by the caller)
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output": "lm_head",
    "output_norm": "model.norm",
}
# block tensors: GGUF stem -> HF name under model.layers.{i}., as llama.cpp's llama converter writes them
BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# general.architecture -> {GGUF block tensor: HF name under model.layers.{i}.} that differ from llama's
BLOCK_OVERRIDES: dict[str, dict[str, str]] = {
    "gemma2": {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    "olmo2": {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
BLOCK_OVERRIDES["gemma3"] = BLOCK_OVERRIDES["gemma2"]

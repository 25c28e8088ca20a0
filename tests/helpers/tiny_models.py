"""Tiny random checkpoints built from transformers configs (never downloaded), plus a byte-level tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

VOCAB_SIZE = 320
EOS_ID = 2

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "llama3_rope": (LlamaConfig, LlamaForCausalLM, dict(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}, rope_theta=500000.0, tie_word_embeddings=True)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=7)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(use_sliding_window=True, sliding_window=6, max_window_layers=1,
                                                   tie_word_embeddings=True)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=32)),
}

# MoE models (tests/engine/test_moe.py): 4 experts, top-2; make_tiny_checkpoint takes these names too.
MOE_ARCHS = {
    "mixtral": (MixtralConfig, MixtralForCausalLM, dict(num_local_experts=4, num_experts_per_tok=2,
                                                        intermediate_size=96, sliding_window=7)),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(num_experts=4, num_experts_per_tok=2,
                                                            moe_intermediate_size=48, head_dim=32)),
    # a dense MLP layer between MoE layers, renormalized top-k, sliding window on every layer
    "qwen3_moe_mixed": (Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, head_dim=32, num_hidden_layers=3,
        mlp_only_layers=[1], norm_topk_prob=True, use_sliding_window=True, sliding_window=6)),
    # gpt-oss: sliding window on layers 0 and 2, full on 1; YaRN rope; a SwiGLU limit low enough to clamp often
    # (the sinks and zero-initialized biases get random values in make_tiny_checkpoint, so each one matters)
    "gpt_oss": (GptOssConfig, GptOssForCausalLM, dict(
        num_local_experts=4, num_experts_per_tok=2, intermediate_size=48, head_dim=16, num_hidden_layers=3,
        sliding_window=5, swiglu_limit=0.5, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 64})),
}

# Gemma (tests/engine/test_gemma.py): a sliding layer then a global one, query_pre_attn_scalar != head_dim, caps small
# enough to bend these logits; Gemma 3 with its own local rope base and linear scaling on the global layers. Their
# norms (zero-initialized by transformers: Gemma scales by 1 + weight) are randomized before saving.
GEMMA_ARCHS = {
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, dict(
        head_dim=16, query_pre_attn_scalar=24, sliding_window=6, attn_logit_softcapping=1.5,
        final_logit_softcapping=3.0, hidden_activation="gelu_pytorch_tanh", pad_token_id=0)),
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, dict(
        head_dim=32, query_pre_attn_scalar=24, sliding_window=6, final_logit_softcapping=3.0, pad_token_id=0,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0}})),
}


# DeepSeek MLA models (tests/engine/test_deepseek.py): 8 experts in 4 groups, top-2 of the best 2 groups, a dense first
# layer, shared experts. V3: q LoRA, sigmoid + correction bias (randomized below); V2: plain q_proj, softmax.
_MLA = dict(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, moe_intermediate_size=32,
            n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1, n_group=4, topk_group=2,
            num_key_value_heads=4)  # transformers repeats its expanded K/V by heads / kv_heads: keep them equal
MLA_ARCHS = {
    "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM, dict(
        _MLA, q_lora_rank=48, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        num_hidden_layers=3)),
    "deepseek_v2": (DeepseekV2Config, DeepseekV2ForCausalLM, dict(
        _MLA, q_lora_rank=None, n_shared_experts=2, routed_scaling_factor=1.5, topk_method="group_limited_greedy")),
}


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Special tokens, the 256 byte tokens, and a few letters: any text encodes, decoding is byte-exact."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(256):
        vocab[f"<0x{i:02X}>"] = 3 + i
    for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz"):
        vocab[ch] = 259 + i
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    backend.decoder = decoders.ByteFallback()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def make_tiny_checkpoint(arch: str, path: Path, seed: int = 0, **overrides):
    """Save a random tiny model of `arch` (safetensors + tokenizer) to `path`; returns the torch model."""
    config_cls, model_cls, extra = {**ARCHS, **MOE_ARCHS, **GEMMA_ARCHS, **MLA_ARCHS}[arch]
    kwargs = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                  eos_token_id=EOS_ID, initializer_range=0.1, rms_norm_eps=1e-6)
    kwargs.update(extra)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval()
    if arch in GEMMA_ARCHS:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.normal_(0.0, 0.3)
    if arch == "gpt_oss":
        _randomize_gpt_oss_extras(model)
    with torch.no_grad():  # DeepSeek-V3's routing bias starts at zero: make it matter
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn(buffer.shape) * 0.05)
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return model


def _randomize_gpt_oss_extras(model) -> None:
    """transformers zero-initializes the expert biases and draws sinks of std 0.02: give them values that move
    the logits (sinks ~ N(0, 1), biases ~ N(0, 0.1))."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
            for bias in (layer.mlp.experts.gate_up_proj_bias, layer.mlp.experts.down_proj_bias, layer.mlp.router.bias):
                bias.normal_(0.0, 0.1)


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def make_tiny_eagle3_head(path: Path, *, target_hidden: int = 64, aux_layers: tuple[int, ...] = (0, 1, 3),
                          draft_to_target: list[int] | None = None, seed: int = 0) -> Path:
    """A random EAGLE-3 head (the published LlamaForCausalLMEagle3 config.json and tensor names) for a tiny
    target of VOCAB_SIZE tokens and `target_hidden` width; its draft vocabulary is `draft_to_target` (target ids,
    default all), mapped through d2t; it reads the target layers `aux_layers`."""
    import json

    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    targets = np.array(draft_to_target if draft_to_target is not None else range(VOCAB_SIZE))
    hidden, heads, kv_heads, head_dim, ffn = 32, 4, 2, 8, 64

    def w(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    layer = "midlayer."
    tensors = {"fc.weight": w(hidden, 3 * target_hidden), "norm.weight": np.ones(hidden, np.float32),
               "lm_head.weight": w(len(targets), hidden), f"{layer}input_layernorm.weight": np.ones(hidden, np.float32),
               f"{layer}hidden_norm.weight": np.ones(hidden, np.float32),
               f"{layer}post_attention_layernorm.weight": np.ones(hidden, np.float32),
               f"{layer}self_attn.q_proj.weight": w(heads * head_dim, 2 * hidden),
               f"{layer}self_attn.k_proj.weight": w(kv_heads * head_dim, 2 * hidden),
               f"{layer}self_attn.v_proj.weight": w(kv_heads * head_dim, 2 * hidden),
               f"{layer}self_attn.o_proj.weight": w(hidden, heads * head_dim),
               f"{layer}mlp.gate_proj.weight": w(ffn, hidden), f"{layer}mlp.up_proj.weight": w(ffn, hidden),
               f"{layer}mlp.down_proj.weight": w(hidden, ffn), "embed_tokens.weight": w(VOCAB_SIZE, hidden),
               "d2t": (targets - np.arange(len(targets))).astype(np.int64)}
    config = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_act="silu",
                  hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  head_dim=head_dim, num_hidden_layers=1, rms_norm_eps=1e-6, rope_theta=10000.0,
                  max_position_embeddings=256, vocab_size=VOCAB_SIZE, draft_vocab_size=len(targets),
                  target_hidden_size=target_hidden, tie_word_embeddings=False,
                  eagle_config={"eagle_aux_hidden_state_layer_ids": list(aux_layers)})
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))
    return path

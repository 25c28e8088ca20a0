"""Tiny random checkpoints built from transformers configs (never downloaded), plus a byte-level tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from vllm_jax.models.family import TINY_DECODER
from vllm_jax.models.registry import tiny_configs

VOCAB_SIZE = TINY_DECODER["vocab_size"]
EOS_ID = TINY_DECODER["eos_token_id"]
# every family's tiny configs by name (models/<family>/configs.py): make_tiny_checkpoint takes these names
TINY_CONFIGS = tiny_configs()
# the MoE checkpoints whose routing tests/engine/test_moe.py checks
MOE_ARCHS = ("mixtral", "qwen3_moe", "qwen3_moe_mixed", "gpt_oss")
# params transformers starts at one, randomized around it by `randomize_norms`: norms (Gemma 4's MoE block's
# `..._layernorm_1/2` too), layer_scalar and the router's scales
_START_AT_ONE = ("norm.weight", "layernorm_1.weight", "layernorm_2.weight", "layer_scalar", "router.scale",
                 "per_expert_scale")


def tiny_config(name: str, **overrides):
    """The transformers config of tiny checkpoint `name` with `overrides`."""
    fields = {**TINY_CONFIGS[name], **overrides}
    return getattr(transformers, fields["architectures"][0]).config_class(**fields)


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


def make_tiny_checkpoint(name: str, path: Path, seed: int = 0, randomize_norms: bool = False, **overrides):
    """Save a random tiny model `name` (TINY_CONFIGS; safetensors + tokenizer) to `path`; returns the torch model.
    What transformers starts at zero and a family's forward reads is randomized (Gemma's norms, which scale by
    1 + weight; gpt-oss's expert biases and sinks; DeepSeek-V3's routing bias); `randomize_norms`: the params it
    starts at one too (_START_AT_ONE), so that a wrong norm placement shows in the logits."""
    config = tiny_config(name, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, config.architectures[0])(config).eval()
    with torch.no_grad():
        for param_name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if param_name.endswith("norm.weight") and not tensor.any():
                tensor.normal_(0.0, 0.3)
            elif randomize_norms and param_name.endswith(_START_AT_ONE):
                tensor.copy_(1.0 + torch.randn(tensor.shape) * 0.3)
            elif param_name.endswith("e_score_correction_bias"):
                tensor.copy_(torch.randn(tensor.shape) * 0.05)
    if hasattr(getattr(model.model.layers[0], "self_attn", None), "sinks"):  # a hybrid's first layer may have none
        _randomize_gpt_oss_extras(model)
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

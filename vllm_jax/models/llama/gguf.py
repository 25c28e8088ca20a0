"""GGUF files of the dense decoders (llama.cpp's `llama`, `mistral`, `qwen2`, `qwen3`; docs/architecture/13-gguf.md):
llama's tensor names; llama.cpp permuted the q/k rows of the llama-converted ones; the switches each states by a
tensor present or a key."""

from __future__ import annotations

from typing import Any

from vllm_jax.models.gguf_family import GgufArch


def mlp_bias(reader: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Llama's config says whether its MLP has biases (llama-converted Granite too)."""
    return {"mlp_bias": any(t.name == "blk.0.ffn_up.bias" for t in reader.tensors)}


def _qwen_window(kwargs: dict[str, Any]) -> dict[str, Any]:
    """One window for every layer, as llama.cpp applies it."""
    return {} if kwargs.get("sliding_window") is None else {"use_sliding_window": True, "max_window_layers": 0}


def _qwen3(reader: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    return _qwen_window(kwargs)


def _qwen2(reader: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs.pop("attention_bias", None)  # Qwen2 always has q/k/v biases; its config has no switch
    return _qwen_window(kwargs)


GGUF_ARCHS = (
    GgufArch("llama", "LlamaConfig", "LlamaForCausalLM", permuted_qk=True, config=mlp_bias),
    GgufArch("mistral", "MistralConfig", "MistralForCausalLM", permuted_qk=True),
    GgufArch("qwen2", "Qwen2Config", "Qwen2ForCausalLM", config=_qwen2),
    GgufArch("qwen3", "Qwen3Config", "Qwen3ForCausalLM", config=_qwen3),
)

"""GGUF files of Granite (llama.cpp's `granite`, converted as a LlamaModel: q/k rows permuted; docs/architecture/
13-gguf.md, "GGUF files of the newer families"): its four multipliers are keys of their own."""

from __future__ import annotations

from typing import Any

from vllm_jax.models.gguf_family import GgufArch, field, float32_decimal
from vllm_jax.models.llama.gguf import mlp_bias

_KEYS = {"attention_multiplier": "attention.scale", "embedding_multiplier": "embedding_scale",
         "residual_multiplier": "residual_scale", "logits_scaling": "logit_scale"}


def granite_config(reader: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    multipliers = {hf: float32_decimal(value) for hf, key in _KEYS.items()
                   if (value := field(reader, f"granite.{key}")) is not None}
    return {**mlp_bias(reader, kwargs), **multipliers}


GGUF_ARCHS = (GgufArch("granite", "GraniteConfig", "GraniteForCausalLM", permuted_qk=True, config=granite_config),)

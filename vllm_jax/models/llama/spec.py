"""The dense decoders' spec: Llama, Mistral, Qwen2 and Qwen3 are one decoder (model/decoder.py) with switches
(qkv bias, q/k norm, sliding windows, rope scaling), set from the HF `architectures` name and the config."""

from __future__ import annotations

from typing import Any

from vllm_jax.model.spec import DecoderSpec, common_spec_fields, pick_architecture

LLAMA_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def spec_from_hf_config(config: Any) -> DecoderSpec:
    arch = pick_architecture(config, LLAMA_ARCHITECTURES)
    common = common_spec_fields(config, arch)
    attention_bias = bool(getattr(config, "attention_bias", False))
    is_qwen2 = arch == "Qwen2ForCausalLM"
    return DecoderSpec(
        **common, intermediate_size=config.intermediate_size,
        qkv_bias=is_qwen2 or attention_bias, o_bias=attention_bias and not is_qwen2,
        mlp_bias=bool(getattr(config, "mlp_bias", False)), qk_norm=arch == "Qwen3ForCausalLM")

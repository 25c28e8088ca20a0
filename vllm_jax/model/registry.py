"""Model classes by HF `architectures` name."""

from __future__ import annotations

from typing import Any

from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.spec import SUPPORTED_ARCHITECTURES, DecoderSpec, spec_from_hf_config

MODEL_REGISTRY: dict[str, type] = {arch: DecoderLM for arch in SUPPORTED_ARCHITECTURES}


def resolve_architecture(hf_config: Any) -> tuple[type, DecoderSpec]:
    """(model class, spec) for a transformers config; an unknown architecture names the supported ones."""
    spec = spec_from_hf_config(hf_config)
    return MODEL_REGISTRY[spec.architecture], spec

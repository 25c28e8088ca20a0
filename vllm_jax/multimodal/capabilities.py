"""What a checkpoint's model can read besides text, from its transformers config alone (no weights loaded): the
server and `LLM.chat` ask before they decode an image (docs/architecture/15-multimodal.md, "Interfaces")."""

from __future__ import annotations

from typing import Any

from vllm_jax.models.qwen2_5_vl.spec import QWEN2_5_VL_ARCHITECTURES
from vllm_jax.models.qwen3_vl.spec import QWEN3_VL_ARCHITECTURES

# architectures whose vision tower is built here (models/registry.py)
VISION_ARCHITECTURES = frozenset(QWEN2_5_VL_ARCHITECTURES + QWEN3_VL_ARCHITECTURES)
# The most images one prompt may hold, per architecture; None: no limit of the model's own (the context length and
# --limit-mm-per-prompt still apply). Qwen2.5-VL and Qwen3-VL have none, as in vLLM.
MAX_IMAGES_PER_PROMPT: dict[str, int | None] = {arch: None for arch in VISION_ARCHITECTURES}


def supports_images(hf_config: Any) -> bool:
    """Whether the model of `hf_config` (a transformers config) reads images here."""
    return any(arch in VISION_ARCHITECTURES for arch in getattr(hf_config, "architectures", None) or ())


def max_images_per_prompt(hf_config: Any) -> int | None:
    """The model's own cap on images per prompt (None: none); 0 for a model that reads no images."""
    if not supports_images(hf_config):
        return 0
    arch = next(a for a in hf_config.architectures if a in VISION_ARCHITECTURES)
    return MAX_IMAGES_PER_PROMPT[arch]

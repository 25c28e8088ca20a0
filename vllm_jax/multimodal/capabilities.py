"""What a checkpoint's model can read besides text, from its transformers config alone (no weights loaded): the
server and `LLM.chat` ask before they decode an image (docs/architecture/15-multimodal.md, "Interfaces"). Each
family says so in its entry (`ModelFamily.reads_images`, models/family.py)."""

from __future__ import annotations

from typing import Any

from vllm_jax.models.registry import family_of_config


def supports_images(hf_config: Any) -> bool:
    """Whether the model of `hf_config` (a transformers config) reads images here."""
    family = family_of_config(hf_config)
    return family is not None and family.reads_images


def max_images_per_prompt(hf_config: Any) -> int | None:
    """The model's own cap on images per prompt (None: none); 0 for a model that reads no images."""
    family = family_of_config(hf_config)
    if family is None or not family.reads_images:
        return 0
    return family.max_images_per_prompt

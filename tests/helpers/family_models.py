"""Tiny random checkpoints of the Granite, OLMo 2 and Phi-3 families (their configs: models/<family>/configs.py),
norms randomized around one."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.models.phi3.configs import TINY_ORIGINAL_CONTEXT as PHI3_ORIGINAL_CONTEXT

__all__ = ["PHI3_ORIGINAL_CONTEXT", "make_family_checkpoint"]


def make_family_checkpoint(family: str, path: Path, seed: int = 0, **overrides):
    """Save a random tiny `family` model (safetensors + byte tokenizer) to `path`; returns the torch model."""
    return make_tiny_checkpoint(family, path, seed, randomize_norms=True, **overrides)

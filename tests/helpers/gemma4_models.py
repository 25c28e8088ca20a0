"""Tiny random Gemma 4 text checkpoints (tests/engine/test_gemma4.py; the config: models/gemma4/configs.py): 5 layers
(sliding, sliding, full, sliding, full), the last two KV-shared (layer 3 reads layer 1's cache, layer 4 layer 2's)
with the double-wide MLP, head_dim 16 and global_head_dim 32, PLE on, a final logit cap small enough to bend these
logits, every norm and layer_scalar randomized (transformers starts them at one). `MOE` adds the MoE block
(tests/engine/test_gemma4_moe.py), its router scales and norms randomized too."""

from __future__ import annotations

from pathlib import Path

from transformers import Gemma4ForCausalLM, Gemma4TextConfig

from tests.helpers.tiny_models import make_tiny_checkpoint, tiny_config
from vllm_jax.models.gemma4.configs import TINY_LAYER_TYPES as LAYER_TYPES
from vllm_jax.models.gemma4.configs import TINY_MOE as MOE

__all__ = ["LAYER_TYPES", "MOE", "gemma4_config", "make_tiny_gemma4"]


def gemma4_config(**overrides) -> Gemma4TextConfig:
    return tiny_config("gemma4", **overrides)


def make_tiny_gemma4(path: Path, seed: int = 0, **overrides) -> Gemma4ForCausalLM:
    """Save a random tiny Gemma 4 (safetensors + tokenizer) to `path`, its norms, layer_scalar and router scales
    randomized around one; returns the torch model."""
    return make_tiny_checkpoint("gemma4", path, seed, randomize_norms=True, **overrides)

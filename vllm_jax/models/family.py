"""`ModelFamily`: everything the engine knows about one family of architectures, declared in one place
(docs/architecture/16-family-unit.md). The engine, the loaders, the partition rules, the GGUF reader and the
compile check read a family's entry through models/registry.py; none of them names an architecture."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_jax.model.spec import DecoderSpec
from vllm_jax.models.gguf_family import GgufArch
from vllm_jax.models.param_source import ParamSource
from vllm_jax.sharding.rules import Rule

WeightMap = Callable[[DecoderSpec], dict[tuple[str, ...], ParamSource]]


@dataclass(frozen=True)
class ModelFamily:
    name: str
    architectures: tuple[str, ...]  # the HF `architectures` names it builds
    model_class: type  # the Flax module (a DecoderLM)
    spec_from_config: Callable[[Any], DecoderSpec]  # transformers config -> the spec the model is built from
    weight_map: WeightMap  # our param path -> the HF tensors it is read from
    # its own params' partition rules, tried before the shared ones (sharding/rules.py)
    sharding_rules: tuple[Rule, ...] = ()
    gguf: tuple[GgufArch, ...] = ()  # the llama.cpp architectures whose GGUF files it reads
    # compile-check configs at real sizes (the public model cards' config.json fields): name -> HF config dict
    real_configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # (real config, layers) -> the fields a config cut to fewer layers must change besides num_hidden_layers
    cut_config: Callable[[Mapping[str, Any], int], dict[str, Any]] | None = None
    # the HF config fields of a tiny random checkpoint per architecture, for the family tests
    tiny_configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    not_built: Mapping[str, str] = field(default_factory=dict)  # an architecture it refuses -> why
    # images in prompts (docs/architecture/15-multimodal.md): whether its model reads them, and its own cap on images
    # per prompt (None: none of the model's own; the context length and --limit-mm-per-prompt still apply)
    reads_images: bool = False
    max_images_per_prompt: int | None = None
    # a hybrid model's recurrent layers keep a state per sequence (docs/architecture/17-state-cache.md): the engine
    # gives it state slots, and refuses what cannot roll a state back yet (config/hybrid_checks.py)
    recurrent_state: bool = False


# the fields every tiny random checkpoint shares (tests/helpers/tiny_models.py builds them): two layers of width
# 64, the byte tokenizer's 320 ids (eos 2)
TINY_DECODER: Mapping[str, Any] = dict(
    vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, initializer_range=0.1,
    rms_norm_eps=1e-6)


def tiny(architecture: str, **fields: Any) -> dict[str, Any]:
    """A tiny config of `architecture`: TINY_DECODER with the family's own `fields`."""
    return {**TINY_DECODER, **fields, "architectures": [architecture]}

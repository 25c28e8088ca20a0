"""Every family's entry, and the lookups the engine, loaders, GGUF reader and compile check use
(docs/architecture/16-family-unit.md). Registering a family is one line in `FAMILIES`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_jax.model.spec import DecoderSpec
from vllm_jax.models import (
    deepseek,
    gemma,
    gemma4,
    gpt_oss,
    granite,
    granite_hybrid,
    llama,
    moe,
    olmo2,
    phi3,
    qwen2_5_vl,
    qwen3_5,
    qwen3_vl,
)
from vllm_jax.models.family import ModelFamily
from vllm_jax.models.fused_weights import with_fused_params
from vllm_jax.models.gguf_family import GgufArch
from vllm_jax.models.param_source import ParamSource

FAMILIES: tuple[ModelFamily, ...] = (
    llama.FAMILY,
    moe.FAMILY,
    gemma.FAMILY,
    gemma4.FAMILY,
    granite.FAMILY,
    olmo2.FAMILY,
    phi3.FAMILY,
    gpt_oss.FAMILY,
    deepseek.FAMILY,
    qwen2_5_vl.FAMILY,
    qwen3_vl.FAMILY,
    qwen3_5.FAMILY,
    granite_hybrid.FAMILY,
)
_BY_ARCHITECTURE = {arch: family for family in FAMILIES for arch in family.architectures}
_NOT_BUILT = {arch: reason for family in FAMILIES for arch, reason in family.not_built.items()}
GGUF_ARCHS: dict[str, GgufArch] = {arch.name: arch for family in FAMILIES for arch in family.gguf}


def family_of(architecture: str) -> ModelFamily:
    """The family that builds an HF `architectures` name; an unknown one names the supported ones."""
    family = _BY_ARCHITECTURE.get(architecture)
    if family is None:
        raise ValueError(f"no model family builds {architecture}; supported: {', '.join(_BY_ARCHITECTURE)}")
    return family


def family_of_config(hf_config: Any) -> ModelFamily | None:
    """The family that builds a transformers config's first registered `architectures` name; None when none does."""
    architectures = getattr(hf_config, "architectures", None) or ()
    return next((_BY_ARCHITECTURE[a] for a in architectures if a in _BY_ARCHITECTURE), None)


def resolve_architecture(hf_config: Any, max_model_len: int | None = None) -> tuple[ModelFamily, DecoderSpec]:
    """(family, spec) for a transformers config; an unknown architecture names the supported ones.
    `max_model_len`: the context the engine serves, which picks LongRoPE's factor set (model/rope_longrope.py);
    None: the short factors."""
    architectures = list(getattr(hf_config, "architectures", None) or [])
    arch = next((a for a in architectures if a in _BY_ARCHITECTURE), None)
    if arch is None:
        reason = next((_NOT_BUILT[a] for a in architectures if a in _NOT_BUILT), None)
        if reason:
            raise ValueError(f"unsupported model architecture {architectures}: {reason}")
        raise ValueError(f"unsupported model architecture {architectures or '(none given)'}; "
                         f"supported: {', '.join(_BY_ARCHITECTURE)}")
    family = _BY_ARCHITECTURE[arch]
    return family, family.spec_from_config(hf_config).for_context(max_model_len)


def param_sources(spec: DecoderSpec) -> dict[tuple[str, ...], ParamSource]:
    """Every param the spec's architecture may have (its family's weight map, fused params added); the loader uses
    those its param tree contains."""
    return with_fused_params(family_of(spec.architecture).weight_map(spec), spec)


def real_configs() -> dict[str, Mapping[str, Any]]:
    """Every family's compile-check configs at real sizes, by name."""
    return {name: config for family in FAMILIES for name, config in family.real_configs.items()}


def tiny_configs() -> dict[str, Mapping[str, Any]]:
    """Every family's tiny random-checkpoint configs, by name (the family tests build them)."""
    return {name: config for family in FAMILIES for name, config in family.tiny_configs.items()}

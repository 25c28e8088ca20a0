"""Each architecture's weight map (our param path -> the HF tensors it is read from), keyed by the HF
`architectures` names that `model/registry.py` uses."""

from __future__ import annotations

from collections.abc import Callable

from vllm_jax.model.mla_spec import MLA_ARCHITECTURES
from vllm_jax.model.moe_spec import MOE_ARCHITECTURES
from vllm_jax.model.spec import SUPPORTED_ARCHITECTURES, DecoderSpec
from vllm_jax.model_loader.decoder_weights import decoder_param_sources
from vllm_jax.model_loader.deepseek_weights import deepseek_param_sources
from vllm_jax.model_loader.moe_weights import moe_param_sources
from vllm_jax.model_loader.param_source import ParamSource

WeightMap = Callable[[DecoderSpec], dict[tuple[str, ...], ParamSource]]

WEIGHT_MAPS: dict[str, WeightMap] = {
    **{arch: decoder_param_sources for arch in SUPPORTED_ARCHITECTURES},
    **{arch: moe_param_sources for arch in MOE_ARCHITECTURES},
    **{arch: deepseek_param_sources for arch in MLA_ARCHITECTURES},
}


def param_sources(spec: DecoderSpec) -> dict[tuple[str, ...], ParamSource]:
    """Every param the spec's architecture may have; the loader uses those its param tree contains."""
    weight_map = WEIGHT_MAPS.get(spec.architecture)
    if weight_map is None:
        raise ValueError(f"no weight map for architecture {spec.architecture}; "
                         f"supported: {', '.join(WEIGHT_MAPS)}")
    return weight_map(spec)

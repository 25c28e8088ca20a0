"""Each architecture's weight map (our param path -> the HF tensors it is read from), keyed by the HF
`architectures` names that `model/registry.py` uses."""

from __future__ import annotations

from collections.abc import Callable

from vllm_jax.model.gemma4_spec import GEMMA4_ARCHITECTURES
from vllm_jax.model.gemma_spec import GEMMA_ARCHITECTURES
from vllm_jax.model.gpt_oss_spec import GPT_OSS_ARCHITECTURES
from vllm_jax.model.granite import GRANITE_ARCHITECTURES
from vllm_jax.model.mla_spec import MLA_ARCHITECTURES
from vllm_jax.model.moe_spec import MOE_ARCHITECTURES
from vllm_jax.model.olmo2 import OLMO2_ARCHITECTURES
from vllm_jax.model.phi3 import PHI3_ARCHITECTURES
from vllm_jax.model.qwen2_5_vl_spec import QWEN2_5_VL_ARCHITECTURES
from vllm_jax.model.qwen3_vl_spec import QWEN3_VL_ARCHITECTURES
from vllm_jax.model.spec import SUPPORTED_ARCHITECTURES, DecoderSpec
from vllm_jax.model_loader.decoder_weights import decoder_param_sources
from vllm_jax.model_loader.deepseek_weights import deepseek_param_sources
from vllm_jax.model_loader.family_weights import olmo2_param_sources, phi3_param_sources
from vllm_jax.model_loader.fused_weights import with_fused_params
from vllm_jax.model_loader.gemma4_weights import gemma4_param_sources
from vllm_jax.model_loader.gemma_weights import gemma_param_sources
from vllm_jax.model_loader.gpt_oss_weights import gpt_oss_param_sources
from vllm_jax.model_loader.moe_weights import moe_param_sources
from vllm_jax.model_loader.param_source import ParamSource
from vllm_jax.model_loader.qwen2_5_vl_weights import qwen2_5_vl_param_sources
from vllm_jax.model_loader.qwen3_vl_weights import qwen3_vl_param_sources

WeightMap = Callable[[DecoderSpec], dict[tuple[str, ...], ParamSource]]

WEIGHT_MAPS: dict[str, WeightMap] = {
    **{arch: decoder_param_sources for arch in SUPPORTED_ARCHITECTURES},
    **{arch: moe_param_sources for arch in MOE_ARCHITECTURES},
    **{arch: gemma_param_sources for arch in GEMMA_ARCHITECTURES},
    **{arch: gemma4_param_sources for arch in GEMMA4_ARCHITECTURES},
    **{arch: decoder_param_sources for arch in GRANITE_ARCHITECTURES},
    **{arch: olmo2_param_sources for arch in OLMO2_ARCHITECTURES},
    **{arch: phi3_param_sources for arch in PHI3_ARCHITECTURES},
    **{arch: gpt_oss_param_sources for arch in GPT_OSS_ARCHITECTURES},
    **{arch: deepseek_param_sources for arch in MLA_ARCHITECTURES},
    **{arch: qwen2_5_vl_param_sources for arch in QWEN2_5_VL_ARCHITECTURES},
    **{arch: qwen3_vl_param_sources for arch in QWEN3_VL_ARCHITECTURES},
}


def param_sources(spec: DecoderSpec) -> dict[tuple[str, ...], ParamSource]:
    """Every param the spec's architecture may have; the loader uses those its param tree contains."""
    weight_map = WEIGHT_MAPS.get(spec.architecture)
    if weight_map is None:
        raise ValueError(f"no weight map for architecture {spec.architecture}; "
                         f"supported: {', '.join(WEIGHT_MAPS)}")
    return with_fused_params(weight_map(spec), spec)

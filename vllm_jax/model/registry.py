"""Model classes by HF `architectures` name: the module to build and how to read its spec from the config.

Where each architecture's weights come from in a checkpoint is the loader's business
(`model_loader/weight_maps.py`, keyed by the same names).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.deepseek import DeepseekLM
from vllm_jax.model.gemma import GemmaLM
from vllm_jax.model.gemma4 import Gemma4LM
from vllm_jax.model.gemma4_spec import GEMMA4_ARCHITECTURES, gemma4_spec_from_hf_config
from vllm_jax.model.gemma_spec import GEMMA_ARCHITECTURES, GEMMA_NOT_BUILT, gemma_spec_from_hf_config
from vllm_jax.model.gpt_oss import GptOssLM
from vllm_jax.model.gpt_oss_spec import GPT_OSS_ARCHITECTURES, gpt_oss_spec_from_hf_config
from vllm_jax.model.granite import GRANITE_ARCHITECTURES, GraniteLM, granite_spec_from_hf_config
from vllm_jax.model.mla_spec import MLA_ARCHITECTURES, mla_spec_from_hf_config
from vllm_jax.model.moe import MoeLM
from vllm_jax.model.moe_spec import MOE_ARCHITECTURES, moe_spec_from_hf_config
from vllm_jax.model.olmo2 import OLMO2_ARCHITECTURES, Olmo2LM, olmo2_spec_from_hf_config
from vllm_jax.model.phi3 import PHI3_ARCHITECTURES, phi3_spec_from_hf_config
from vllm_jax.model.qwen2_5_vl import Qwen2_5_VLLM
from vllm_jax.model.qwen2_5_vl_spec import QWEN2_5_VL_ARCHITECTURES, qwen2_5_vl_spec_from_hf_config
from vllm_jax.model.qwen3_vl import Qwen3VLLM
from vllm_jax.model.qwen3_vl_spec import QWEN3_VL_ARCHITECTURES, qwen3_vl_spec_from_hf_config
from vllm_jax.model.rope_longrope import for_context
from vllm_jax.model.spec import SUPPORTED_ARCHITECTURES, DecoderSpec, spec_from_hf_config


@dataclass(frozen=True)
class ModelEntry:
    model_class: type[DecoderLM]
    spec_from_config: Callable[[Any], DecoderSpec]


MODEL_REGISTRY: dict[str, ModelEntry] = {
    **{arch: ModelEntry(DecoderLM, spec_from_hf_config) for arch in SUPPORTED_ARCHITECTURES},
    **{arch: ModelEntry(MoeLM, moe_spec_from_hf_config) for arch in MOE_ARCHITECTURES},
    **{arch: ModelEntry(GemmaLM, gemma_spec_from_hf_config) for arch in GEMMA_ARCHITECTURES},
    **{arch: ModelEntry(Gemma4LM, gemma4_spec_from_hf_config) for arch in GEMMA4_ARCHITECTURES},
    **{arch: ModelEntry(GraniteLM, granite_spec_from_hf_config) for arch in GRANITE_ARCHITECTURES},
    **{arch: ModelEntry(Olmo2LM, olmo2_spec_from_hf_config) for arch in OLMO2_ARCHITECTURES},
    **{arch: ModelEntry(DecoderLM, phi3_spec_from_hf_config) for arch in PHI3_ARCHITECTURES},
    **{arch: ModelEntry(GptOssLM, gpt_oss_spec_from_hf_config) for arch in GPT_OSS_ARCHITECTURES},
    **{arch: ModelEntry(DeepseekLM, mla_spec_from_hf_config) for arch in MLA_ARCHITECTURES},
    **{arch: ModelEntry(Qwen2_5_VLLM, qwen2_5_vl_spec_from_hf_config) for arch in QWEN2_5_VL_ARCHITECTURES},
    **{arch: ModelEntry(Qwen3VLLM, qwen3_vl_spec_from_hf_config) for arch in QWEN3_VL_ARCHITECTURES},
}


def resolve_architecture(hf_config: Any, max_model_len: int | None = None) -> tuple[ModelEntry, DecoderSpec]:
    """(registry entry, spec) for a transformers config; an unknown architecture names the supported ones.
    `max_model_len`: the context the engine serves, which picks LongRoPE's factor set (model/rope_longrope.py);
    None: the short factors."""
    architectures = list(getattr(hf_config, "architectures", None) or [])
    arch = next((a for a in architectures if a in MODEL_REGISTRY), None)
    if arch is None:
        reason = next((GEMMA_NOT_BUILT[a] for a in architectures if a in GEMMA_NOT_BUILT), None)
        if reason:
            raise ValueError(f"unsupported model architecture {architectures}: {reason}")
        raise ValueError(f"unsupported model architecture {architectures or '(none given)'}; "
                         f"supported: {', '.join(MODEL_REGISTRY)}")
    entry = MODEL_REGISTRY[arch]
    return entry, for_context(entry.spec_from_config(hf_config), max_model_len)

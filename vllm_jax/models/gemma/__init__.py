"""Gemma 2 and Gemma 3 (text): GeGLU, soft caps, sliding / global layers (docs/architecture/12-families.md)."""

from vllm_jax.models.family import ModelFamily
from vllm_jax.models.gemma.configs import GEMMA2_9B, GEMMA3_27B, TINY, cut_gemma_config
from vllm_jax.models.gemma.gguf import GGUF_ARCHS
from vllm_jax.models.gemma.model import GemmaLM
from vllm_jax.models.gemma.spec import GEMMA_ARCHITECTURES, GEMMA_NOT_BUILT, gemma_spec_from_hf_config
from vllm_jax.models.gemma.weights import gemma_param_sources

FAMILY = ModelFamily(
    name="gemma", architectures=GEMMA_ARCHITECTURES, model_class=GemmaLM, spec_from_config=gemma_spec_from_hf_config,
    weight_map=gemma_param_sources, gguf=GGUF_ARCHS, real_configs={"gemma-2-9b": GEMMA2_9B, "gemma-3-27b": GEMMA3_27B},
    cut_config=cut_gemma_config, not_built=GEMMA_NOT_BUILT,
    tiny_configs=TINY)

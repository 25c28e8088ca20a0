"""Granite: the Llama decoder with four multipliers (docs/architecture/12-families.md)."""

from vllm_jax.models.family import ModelFamily
from vllm_jax.models.granite.configs import GRANITE_3_8B, TINY
from vllm_jax.models.granite.gguf import GGUF_ARCHS
from vllm_jax.models.granite.model import GRANITE_ARCHITECTURES, GraniteLM, granite_spec_from_hf_config
from vllm_jax.models.llama.weights import decoder_param_sources

FAMILY = ModelFamily(
    name="granite", architectures=GRANITE_ARCHITECTURES, model_class=GraniteLM,
    spec_from_config=granite_spec_from_hf_config, weight_map=decoder_param_sources, gguf=GGUF_ARCHS,
    real_configs={"granite-3-8b": GRANITE_3_8B},
    tiny_configs=TINY)

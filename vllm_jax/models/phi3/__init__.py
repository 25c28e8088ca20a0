"""Phi-3: the Llama decoder with fused checkpoint projections and LongRoPE (docs/architecture/12-families.md)."""

from vllm_jax.model.decoder import DecoderLM
from vllm_jax.models.family import ModelFamily
from vllm_jax.models.phi3.configs import PHI3_MINI_128K, TINY
from vllm_jax.models.phi3.gguf import GGUF_ARCHS
from vllm_jax.models.phi3.spec import PHI3_ARCHITECTURES, phi3_spec_from_hf_config
from vllm_jax.models.phi3.weights import phi3_param_sources

FAMILY = ModelFamily(
    name="phi3", architectures=PHI3_ARCHITECTURES, model_class=DecoderLM, spec_from_config=phi3_spec_from_hf_config,
    weight_map=phi3_param_sources, gguf=GGUF_ARCHS, real_configs={"phi-3-mini-128k": PHI3_MINI_128K},
    tiny_configs=TINY)

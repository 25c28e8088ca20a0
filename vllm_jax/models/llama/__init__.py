"""The dense decoders: Llama, Mistral, Qwen2, Qwen3 (model/decoder.py with switches;
docs/architecture/12-families.md)."""

from vllm_jax.model.decoder import DecoderLM
from vllm_jax.models.family import ModelFamily
from vllm_jax.models.llama.configs import LLAMA3_8B, QWEN3_8B, TINY
from vllm_jax.models.llama.gguf import GGUF_ARCHS
from vllm_jax.models.llama.spec import LLAMA_ARCHITECTURES, spec_from_hf_config
from vllm_jax.models.llama.weights import decoder_param_sources

FAMILY = ModelFamily(
    name="llama", architectures=LLAMA_ARCHITECTURES, model_class=DecoderLM, spec_from_config=spec_from_hf_config,
    weight_map=decoder_param_sources, gguf=GGUF_ARCHS,
    real_configs={"llama-3.1-8b": LLAMA3_8B, "qwen3-8b": QWEN3_8B},
    tiny_configs=TINY)

"""OLMo 2: post-norms and whole-projection q/k norms (docs/architecture/12-families.md)."""

from vllm_jax.models.family import ModelFamily
from vllm_jax.models.gguf_family import GgufArch
from vllm_jax.models.olmo2.configs import OLMO2_7B, TINY
from vllm_jax.models.olmo2.model import OLMO2_ARCHITECTURES, Olmo2LM, olmo2_spec_from_hf_config
from vllm_jax.models.olmo2.weights import olmo2_param_sources

# llama.cpp's `olmo2` gives `post_attention_norm` / `post_ffw_norm` the post-norms' names
GGUF_ARCHS = (GgufArch("olmo2", "Olmo2Config", "Olmo2ForCausalLM",
                       block_names={"post_attention_norm": "post_attention_layernorm",
                                    "post_ffw_norm": "post_feedforward_layernorm"}),)

FAMILY = ModelFamily(
    name="olmo2", architectures=OLMO2_ARCHITECTURES, model_class=Olmo2LM, spec_from_config=olmo2_spec_from_hf_config,
    weight_map=olmo2_param_sources, gguf=GGUF_ARCHS, real_configs={"olmo-2-7b": OLMO2_7B},
    tiny_configs=TINY)

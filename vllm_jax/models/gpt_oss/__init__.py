"""gpt-oss: attention sinks, alternating windows, clamped SwiGLU experts (docs/architecture/12-families.md)."""

from vllm_jax.models.family import ModelFamily
from vllm_jax.models.gpt_oss.configs import GPT_OSS_20B, TINY
from vllm_jax.models.gpt_oss.gguf import GGUF_ARCHS
from vllm_jax.models.gpt_oss.model import GptOssLM
from vllm_jax.models.gpt_oss.spec import GPT_OSS_ARCHITECTURES, gpt_oss_spec_from_hf_config
from vllm_jax.models.gpt_oss.weights import gpt_oss_param_sources

# the experts' [L, E, H, 2I] / [L, E, 2I] interleaved gate/up pairs stay whole; the sinks [L, num_heads] split
# with the query heads
SHARDING_RULES = ((r"^layers/experts_gate_up(_bias)?$", -1), (r"^layers/sinks$", -1))

FAMILY = ModelFamily(
    name="gpt_oss", architectures=GPT_OSS_ARCHITECTURES, model_class=GptOssLM,
    spec_from_config=gpt_oss_spec_from_hf_config, weight_map=gpt_oss_param_sources, sharding_rules=SHARDING_RULES,
    gguf=GGUF_ARCHS, real_configs={"gpt-oss-20b": GPT_OSS_20B},
    tiny_configs=TINY)

"""DeepSeek-V2 / V3: multi-head latent attention and routed plus shared experts (docs/architecture/12-families.md)."""

from vllm_jax.models.deepseek.configs import DEEPSEEK_V3, TINY
from vllm_jax.models.deepseek.gguf import GGUF_ARCHS
from vllm_jax.models.deepseek.model import DeepseekLM
from vllm_jax.models.deepseek.spec import MLA_ARCHITECTURES, mla_spec_from_hf_config
from vllm_jax.models.deepseek.weights import deepseek_param_sources
from vllm_jax.models.family import ModelFamily

# MLA (mla.py): q_b / kv_b outputs are head-major, split by heads; the latent projections (q_a_proj, kv_a_proj) and
# the latent cache are replicated; the shared experts split like a dense MLP
SHARDING_RULES = ((r"^layers/(q_b_proj|kv_b_proj|shared_gate|shared_up)$", -1), (r"^layers/shared_down$", -2))

FAMILY = ModelFamily(
    name="deepseek", architectures=MLA_ARCHITECTURES, model_class=DeepseekLM, spec_from_config=mla_spec_from_hf_config,
    weight_map=deepseek_param_sources, sharding_rules=SHARDING_RULES, gguf=GGUF_ARCHS,
    real_configs={"deepseek-v3": DEEPSEEK_V3},
    tiny_configs=TINY)

"""Mixtral and Qwen3-MoE: the decoder with routed experts (model/moe.py; docs/architecture/12-families.md)."""

from vllm_jax.model.moe import MoeLM
from vllm_jax.models.family import ModelFamily
from vllm_jax.models.moe.configs import MIXTRAL_8X7B, QWEN3_30B_A3B, TINY
from vllm_jax.models.moe.spec import MOE_ARCHITECTURES, moe_spec_from_hf_config
from vllm_jax.models.moe.weights import moe_param_sources

FAMILY = ModelFamily(
    name="moe", architectures=MOE_ARCHITECTURES, model_class=MoeLM, spec_from_config=moe_spec_from_hf_config,
    weight_map=moe_param_sources, real_configs={"qwen3-30b-a3b": QWEN3_30B_A3B, "mixtral-8x7b": MIXTRAL_8X7B},
    tiny_configs=TINY)

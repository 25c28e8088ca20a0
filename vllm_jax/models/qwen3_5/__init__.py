"""Qwen3.5: gated DeltaNet and gated attention layers with a state per sequence (docs/architecture/12-families.md,
"Qwen3.5"; docs/architecture/17-state-cache.md)."""

from vllm_jax.models.family import ModelFamily
from vllm_jax.models.qwen3_5.configs import QWEN3_5_27B, TINY, cut_qwen3_5_config
from vllm_jax.models.qwen3_5.model import Qwen3_5LM
from vllm_jax.models.qwen3_5.spec import QWEN3_5_ARCHITECTURES, qwen3_5_spec_from_hf_config
from vllm_jax.models.qwen3_5.weights import qwen3_5_param_sources

FAMILY = ModelFamily(
    name="qwen3_5", architectures=QWEN3_5_ARCHITECTURES, model_class=Qwen3_5LM,
    spec_from_config=qwen3_5_spec_from_hf_config, weight_map=qwen3_5_param_sources, tiny_configs=TINY,
    real_configs={"qwen3.5-27b": QWEN3_5_27B}, cut_config=cut_qwen3_5_config,
    recurrent_state=True)

"""Granite 4.0-H: Mamba2 layers and a few attention layers with a state per sequence (docs/architecture/12-families.md,
"Granite 4.0-H"; docs/architecture/17-state-cache.md)."""

from vllm_jax.models.family import ModelFamily
from vllm_jax.models.granite_hybrid.configs import GRANITE_4_H_350M, TINY, cut_granite_hybrid_config
from vllm_jax.models.granite_hybrid.model import GraniteHybridLM
from vllm_jax.models.granite_hybrid.spec import GRANITE_HYBRID_ARCHITECTURES, granite_hybrid_spec_from_hf_config
from vllm_jax.models.granite_hybrid.weights import granite_hybrid_param_sources

FAMILY = ModelFamily(
    name="granite_hybrid", architectures=GRANITE_HYBRID_ARCHITECTURES, model_class=GraniteHybridLM,
    spec_from_config=granite_hybrid_spec_from_hf_config, weight_map=granite_hybrid_param_sources, tiny_configs=TINY,
    real_configs={"granite-4.0-h-350m": GRANITE_4_H_350M}, cut_config=cut_granite_hybrid_config,
    recurrent_state=True)

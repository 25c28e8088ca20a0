"""Gemma 4 (text decoder): per-layer-type heads, KV sharing, per-layer inputs, an optional MoE block
(docs/architecture/12-families.md)."""

from vllm_jax.models.family import ModelFamily
from vllm_jax.models.gemma4.configs import GEMMA4_26B_A4B, GEMMA4_E4B, TINY, cut_gemma4_config
from vllm_jax.models.gemma4.gguf import GGUF_ARCHS
from vllm_jax.models.gemma4.model import Gemma4LM
from vllm_jax.models.gemma4.spec import GEMMA4_ARCHITECTURES, gemma4_spec_from_hf_config
from vllm_jax.models.gemma4.weights import gemma4_param_sources

_COLUMN, _ROW = -1, -2
# layers stacked per group, `layers/{sliding|full}[_shared]_{name}`; its K/V projections stay replicated (per-layer
# KV head counts, tp rarely divides E4B's 2); the per-layer-input embedding table [V, L * ple] is vocab-parallel
# like embed_tokens; the MoE block's experts (moe_block.py) without EP split on I like Mixtral's
SHARDING_RULES = (
    (r"^layers/(sliding|full)(_shared)?_(q_proj|gate_proj|up_proj|per_layer_input_gate)$", _COLUMN),
    (r"^layers/(sliding|full)(_shared)?_(o_proj|down_proj|per_layer_projection)$", _ROW),
    (r"^embed_tokens_per_layer$", -2),
    (r"^layers/(sliding|full)(_shared)?_experts_(gate|up)$", _COLUMN),
    (r"^layers/(sliding|full)(_shared)?_experts_down$", _ROW),
)

FAMILY = ModelFamily(
    name="gemma4", architectures=GEMMA4_ARCHITECTURES, model_class=Gemma4LM,
    spec_from_config=gemma4_spec_from_hf_config, weight_map=gemma4_param_sources, sharding_rules=SHARDING_RULES,
    gguf=GGUF_ARCHS, real_configs={"gemma-4-e4b": GEMMA4_E4B, "gemma-4-26b-a4b": GEMMA4_26B_A4B},
    cut_config=cut_gemma4_config,
    tiny_configs=TINY)

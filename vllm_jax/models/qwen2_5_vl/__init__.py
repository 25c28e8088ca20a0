"""Qwen2.5-VL: the Qwen2 decoder with M-RoPE and a vision tower (docs/architecture/15-multimodal.md)."""

from vllm_jax.models.family import ModelFamily
from vllm_jax.models.qwen2_5_vl.model import Qwen2_5_VLLM
from vllm_jax.models.qwen2_5_vl.spec import QWEN2_5_VL_ARCHITECTURES, qwen2_5_vl_spec_from_hf_config
from vllm_jax.models.qwen2_5_vl.weights import qwen2_5_vl_param_sources

FAMILY = ModelFamily(
    name="qwen2_5_vl", architectures=QWEN2_5_VL_ARCHITECTURES, model_class=Qwen2_5_VLLM,
    spec_from_config=qwen2_5_vl_spec_from_hf_config, weight_map=qwen2_5_vl_param_sources,
    reads_images=True)  # no cap of its own on images per prompt, as in vLLM

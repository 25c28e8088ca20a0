"""Qwen3-VL: the Qwen3 decoder with interleaved M-RoPE, a vision tower and DeepStack
(docs/architecture/15-multimodal.md)."""

from vllm_jax.models.family import ModelFamily
from vllm_jax.models.qwen3_vl.model import Qwen3VLLM
from vllm_jax.models.qwen3_vl.spec import QWEN3_VL_ARCHITECTURES, qwen3_vl_spec_from_hf_config
from vllm_jax.models.qwen3_vl.weights import qwen3_vl_param_sources

FAMILY = ModelFamily(
    name="qwen3_vl", architectures=QWEN3_VL_ARCHITECTURES, model_class=Qwen3VLLM,
    spec_from_config=qwen3_vl_spec_from_hf_config, weight_map=qwen3_vl_param_sources,
    reads_images=True)  # no cap of its own on images per prompt, as in vLLM

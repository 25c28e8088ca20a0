"""Qwen2.5-VL's params by HF tensor name: the Qwen2 decoder's (model.*, lm_head) and the vision tower's
(visual.*), as the released checkpoints and transformers' save_pretrained name them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_jax.models.llama.weights import decoder_param_sources
from vllm_jax.models.param_source import ParamSource, TensorReader, per_layer, single
from vllm_jax.models.qwen2_5_vl.spec import Qwen2_5_VLSpec

# our vision block param -> (HF suffix under visual.blocks.{layer}., transpose)
_BLOCK_TENSORS = {
    "norm1": ("norm1.weight", False), "norm2": ("norm2.weight", False),
    "qkv": ("attn.qkv.weight", True), "qkv_bias": ("attn.qkv.bias", False),
    "proj": ("attn.proj.weight", True), "proj_bias": ("attn.proj.bias", False),
    "gate_proj": ("mlp.gate_proj.weight", True), "gate_bias": ("mlp.gate_proj.bias", False),
    "up_proj": ("mlp.up_proj.weight", True), "up_bias": ("mlp.up_proj.bias", False),
    "down_proj": ("mlp.down_proj.weight", True), "down_bias": ("mlp.down_proj.bias", False),
}


@dataclass(frozen=True)
class FlattenedConvSource(ParamSource):
    """The patch embedding's Conv3d weight [out, C, T, P, P] read as a matmul weight [C*T*P*P, out] (stride =
    kernel, so the convolution is one matmul over each flattened patch). Read whole (the tower is replicated)."""

    conv_shape: tuple[int, ...] = ()

    def hf_shape(self, param_shape: tuple[int, ...]) -> tuple[int, ...]:
        return self.conv_shape

    def read(self, checkpoint: TensorReader, index: tuple[slice, ...], param_shape: tuple[int, ...],
             dtype) -> np.ndarray:
        tensor = checkpoint.read(str(self.names), (slice(None),) * len(self.conv_shape))
        return tensor.reshape(self.conv_shape[0], -1).T.astype(dtype, copy=False)[tuple(index)]


def qwen2_5_vl_param_sources(spec: Qwen2_5_VLSpec) -> dict[tuple[str, ...], ParamSource]:
    sources = decoder_param_sources(spec)
    v = spec.vision
    conv = (v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    sources[("vision", "patch_embed")] = FlattenedConvSource(
        np.array("visual.patch_embed.proj.weight", dtype=object), conv_shape=conv)
    for name, (suffix, transpose) in _BLOCK_TENSORS.items():
        sources[("vision", name)] = per_layer(f"visual.blocks.{{layer}}.{suffix}", v.depth, transpose)
    sources[("vision", "merger_norm")] = single("visual.merger.ln_q.weight")
    sources[("vision", "merger_fc1")] = single("visual.merger.mlp.0.weight", transpose=True)
    sources[("vision", "merger_fc1_bias")] = single("visual.merger.mlp.0.bias")
    sources[("vision", "merger_fc2")] = single("visual.merger.mlp.2.weight", transpose=True)
    sources[("vision", "merger_fc2_bias")] = single("visual.merger.mlp.2.bias")
    return sources

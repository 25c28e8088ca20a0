"""Qwen3-VL's params by HF tensor name: the Qwen3 decoder's under `model.language_model.` (plus `lm_head`) and
the vision tower's under `model.visual.`, as the released checkpoints and transformers' save_pretrained name
them."""

from __future__ import annotations

import numpy as np

from vllm_jax.models.llama.weights import LAYER_TENSORS
from vllm_jax.models.param_source import ParamSource, per_layer, single
from vllm_jax.models.qwen2_5_vl.weights import FlattenedConvSource
from vllm_jax.models.qwen3_vl.spec import Qwen3VLSpec

_LM = "model.language_model."
_VISUAL = "model.visual."
# our vision block param -> (HF suffix under model.visual.blocks.{layer}., transpose)
_BLOCK_TENSORS = {
    "norm1": ("norm1.weight", False), "norm1_bias": ("norm1.bias", False),
    "norm2": ("norm2.weight", False), "norm2_bias": ("norm2.bias", False),
    "qkv": ("attn.qkv.weight", True), "qkv_bias": ("attn.qkv.bias", False),
    "proj": ("attn.proj.weight", True), "proj_bias": ("attn.proj.bias", False),
    "fc1": ("mlp.linear_fc1.weight", True), "fc1_bias": ("mlp.linear_fc1.bias", False),
    "fc2": ("mlp.linear_fc2.weight", True), "fc2_bias": ("mlp.linear_fc2.bias", False),
}
# merger param suffix -> (HF name under the merger, transpose)
_MERGER_TENSORS = {
    "norm": ("norm.weight", False), "norm_bias": ("norm.bias", False),
    "fc1": ("linear_fc1.weight", True), "fc1_bias": ("linear_fc1.bias", False),
    "fc2": ("linear_fc2.weight", True), "fc2_bias": ("linear_fc2.bias", False),
}


def qwen3_vl_param_sources(spec: Qwen3VLSpec) -> dict[tuple[str, ...], ParamSource]:
    sources: dict[tuple[str, ...], ParamSource] = {
        ("embed_tokens",): single(_LM + "embed_tokens.weight"),
        ("final_norm",): single(_LM + "norm.weight"),
        ("lm_head",): single("lm_head.weight", transpose=True),
    }
    for name, (suffix, transpose) in LAYER_TENSORS.items():
        sources[("layers", name)] = per_layer(f"{_LM}layers.{{layer}}.{suffix}", spec.num_layers, transpose)
    v = spec.vision
    conv = (v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    sources[("vision", "patch_embed")] = FlattenedConvSource(
        np.array(_VISUAL + "patch_embed.proj.weight", dtype=object), conv_shape=conv)
    sources[("vision", "patch_bias")] = single(_VISUAL + "patch_embed.proj.bias")
    sources[("vision", "pos_embed")] = single(_VISUAL + "pos_embed.weight")
    for name, (suffix, transpose) in _BLOCK_TENSORS.items():
        sources[("vision", name)] = per_layer(f"{_VISUAL}blocks.{{layer}}.{suffix}", v.depth, transpose)
    for name, (suffix, transpose) in _MERGER_TENSORS.items():
        sources[("vision", f"merger_{name}")] = single(f"{_VISUAL}merger.{suffix}", transpose)
        sources[("vision", f"deepstack_{name}")] = per_layer(
            f"{_VISUAL}deepstack_merger_list.{{layer}}.{suffix}", len(v.deepstack_visual_indexes), transpose)
    return sources

"""Qwen2.5-VL's spec: the Qwen2 language model's DecoderSpec plus M-RoPE's sections and the vision tower's facts
(docs/architecture/15-multimodal.md, "Qwen2.5-VL")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_jax.model.spec import DecoderSpec, common_spec_fields, pick_architecture, rope_parameters_of
from vllm_jax.models.qwen2_5_vl.vision_layout import VisionInputs, vision_inputs

QWEN2_5_VL_ARCHITECTURES = ("Qwen2_5_VLForConditionalGeneration",)


@dataclass(frozen=True)
class VisionTowerSpec:
    """What the Qwen vision towers share: patch embedding over `patch_size` pixels and `temporal_patch_size` frames,
    `depth` blocks of `num_heads` heads with 2D rope, the 2x2 merger into the language model's width."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int
    temporal_patch_size: int
    in_channels: int
    spatial_merge_size: int
    rope_theta: float
    hidden_act: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """One flattened patch (channels x frames x rows x columns): a row of the processor's pixel_values."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        """Patches merged into one language-model token."""
        return self.spatial_merge_size ** 2


@dataclass(frozen=True)
class VisionSpec(VisionTowerSpec):
    """Qwen2.5-VL's tower: window attention except in `fullatt_block_indexes`."""

    window_size: int
    fullatt_block_indexes: tuple[int, ...]

    def encoder_inputs(self, pixels: np.ndarray, grids: list[tuple[int, int, int]],
                       num_patches_padded: int) -> VisionInputs:
        """The host layout of one encoder call (window order, rope positions, segments), padded to the bucket."""
        return vision_inputs(pixels, grids, self.spatial_merge_size, self.window_size // self.patch_size,
                             num_patches_padded)


@dataclass(frozen=True)
class Qwen2_5_VLSpec(DecoderSpec):
    # M-RoPE: rotary frequency pairs per position stream (t, h, w), summing to head_dim / 2
    mrope_section: tuple[int, ...] = field(default=(), kw_only=True)
    vision: VisionSpec | None = field(default=None, kw_only=True)
    image_token_id: int = field(default=-1, kw_only=True)  # <|image_pad|>, one per merged patch
    vision_start_token_id: int = field(default=-1, kw_only=True)
    # Qwen3-VL: the streams' frequencies interleave (t h w t h w ...) instead of one section per stream
    mrope_interleaved: bool = field(default=False, kw_only=True)

    @property
    def mm_embed_width(self) -> int:
        """Columns of a step's `mm_embeds` (and of one image token's encoder output): the LM's width here;
        Qwen3-VL adds its DeepStack features (models/qwen3_vl/spec.py)."""
        return self.hidden_size


def qwen2_5_vl_spec_from_hf_config(config: Any) -> Qwen2_5_VLSpec:
    arch = pick_architecture(config, QWEN2_5_VL_ARCHITECTURES)
    text = getattr(config, "text_config", config)
    rope = rope_parameters_of(text)
    mrope = tuple(int(s) for s in rope.pop("mrope_section", None) or ())
    if rope.get("rope_type") in ("mrope", "default"):
        rope["rope_type"] = "default"
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if sum(mrope) != head_dim // 2:
        raise ValueError(f"{arch}: mrope_section {list(mrope)} must sum to head_dim / 2 ({head_dim // 2})")
    common = common_spec_fields(text, arch, rope=rope)
    common["tie_word_embeddings"] = bool(getattr(config, "tie_word_embeddings", common["tie_word_embeddings"]))
    v = config.vision_config
    vision = VisionSpec(
        depth=v.depth, hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, num_heads=v.num_heads,
        out_hidden_size=v.out_hidden_size, patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
        in_channels=v.in_channels, spatial_merge_size=v.spatial_merge_size, window_size=v.window_size,
        fullatt_block_indexes=tuple(int(i) for i in v.fullatt_block_indexes),
        rope_theta=float((getattr(v, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
        hidden_act=v.hidden_act)
    if vision.hidden_act not in ("silu", "gelu", "gelu_pytorch_tanh", "quick_gelu"):
        raise ValueError(f"{arch}: vision hidden_act {vision.hidden_act!r} is not supported")
    if vision.out_hidden_size != text.hidden_size:
        raise ValueError(f"{arch}: vision out_hidden_size {vision.out_hidden_size} != hidden_size {text.hidden_size}")
    return Qwen2_5_VLSpec(**common, intermediate_size=text.intermediate_size, qkv_bias=True, o_bias=False,
                          mlp_bias=False, qk_norm=False, mrope_section=mrope, vision=vision,
                          image_token_id=int(config.image_token_id),
                          vision_start_token_id=int(config.vision_start_token_id))

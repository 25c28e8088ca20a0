"""Qwen3-VL's spec: the Qwen3 language model's DecoderSpec (q/k norms) with interleaved M-RoPE, DeepStack, and
its vision tower's facts (docs/architecture/15-multimodal.md, "Qwen3-VL")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_jax.model.spec import common_spec_fields, pick_architecture, rope_parameters_of
from vllm_jax.models.qwen2_5_vl.spec import Qwen2_5_VLSpec, VisionTowerSpec
from vllm_jax.models.qwen3_vl.vision_layout import Qwen3VisionInputs, qwen3_vision_inputs

QWEN3_VL_ARCHITECTURES = ("Qwen3VLForConditionalGeneration",)
_ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "quick_gelu")


@dataclass(frozen=True)
class Qwen3VisionSpec(VisionTowerSpec):
    """The vision transformer: patch embedding plus a learned position table resampled to each image's grid,
    `depth` LayerNorm blocks of full attention within an image, the 2x2 patch merger, and one more merger per
    DeepStack layer (`deepstack_visual_indexes`) whose output is added to the LM's first layers."""

    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]

    def encoder_inputs(self, pixels: np.ndarray, grids: list[tuple[int, int, int]],
                       num_patches_padded: int) -> Qwen3VisionInputs:
        """The host layout of one encoder call (rope positions, segments, position-table taps), padded."""
        return qwen3_vision_inputs(pixels, grids, self.spatial_merge_size, self.num_position_embeddings,
                                   num_patches_padded)


@dataclass(frozen=True)
class Qwen3VLSpec(Qwen2_5_VLSpec):
    vision: Qwen3VisionSpec | None = field(default=None, kw_only=True)

    @property
    def num_deepstack(self) -> int:
        return len(self.vision.deepstack_visual_indexes) if self.vision else 0

    @property
    def mm_embed_width(self) -> int:
        """An image token's encoder output: its input embedding, then one DeepStack feature per LM layer it is
        added to (layers 0 .. num_deepstack - 1), each hidden_size wide."""
        return self.hidden_size * (1 + self.num_deepstack)


def qwen3_vl_spec_from_hf_config(config: Any) -> Qwen3VLSpec:
    arch = pick_architecture(config, QWEN3_VL_ARCHITECTURES)
    text = config.text_config
    rope = rope_parameters_of(text)
    mrope = tuple(int(s) for s in rope.pop("mrope_section", None) or (24, 20, 20))  # transformers' default
    rope.pop("mrope_interleaved", None)  # transformers' Qwen3-VL always interleaves
    if rope.get("rope_type") == "mrope":
        rope["rope_type"] = "default"
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if len(mrope) != 3 or sum(mrope) != head_dim // 2:
        raise ValueError(f"{arch}: mrope_section {list(mrope)} must be three sections summing to head_dim / 2 "
                         f"({head_dim // 2})")
    common = common_spec_fields(text, arch, rope=rope)
    common["tie_word_embeddings"] = bool(getattr(config, "tie_word_embeddings", common["tie_word_embeddings"]))
    bias = bool(getattr(text, "attention_bias", False))
    v = config.vision_config
    vision = Qwen3VisionSpec(
        depth=v.depth, hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, num_heads=v.num_heads,
        out_hidden_size=v.out_hidden_size, patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
        in_channels=v.in_channels, spatial_merge_size=v.spatial_merge_size,
        num_position_embeddings=v.num_position_embeddings,
        deepstack_visual_indexes=tuple(int(i) for i in v.deepstack_visual_indexes),
        rope_theta=float((getattr(v, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
        hidden_act=v.hidden_act)
    if vision.hidden_act not in _ACTIVATIONS:
        raise ValueError(f"{arch}: vision hidden_act {vision.hidden_act!r} is not supported")
    if vision.out_hidden_size != text.hidden_size:
        raise ValueError(f"{arch}: vision out_hidden_size {vision.out_hidden_size} != hidden_size {text.hidden_size}")
    if int(vision.num_position_embeddings ** 0.5) ** 2 != vision.num_position_embeddings:
        raise ValueError(f"{arch}: num_position_embeddings {vision.num_position_embeddings} is not a square")
    if sorted(set(vision.deepstack_visual_indexes)) != list(vision.deepstack_visual_indexes) or any(
            not 0 <= i < vision.depth for i in vision.deepstack_visual_indexes):
        raise ValueError(f"{arch}: deepstack_visual_indexes {list(vision.deepstack_visual_indexes)} must be "
                         f"increasing block indexes below depth {vision.depth}")
    if len(vision.deepstack_visual_indexes) > text.num_hidden_layers:
        raise ValueError(f"{arch}: {len(vision.deepstack_visual_indexes)} DeepStack features but only "
                         f"{text.num_hidden_layers} language-model layers")
    return Qwen3VLSpec(**common, intermediate_size=text.intermediate_size, qkv_bias=bias, o_bias=bias,
                       mlp_bias=False, qk_norm=True, mrope_section=mrope, mrope_interleaved=True, vision=vision,
                       image_token_id=int(config.image_token_id),
                       vision_start_token_id=int(config.vision_start_token_id))

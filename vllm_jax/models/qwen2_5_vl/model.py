"""Qwen2.5-VL: the Qwen2 decoder (DecoderLM) with M-RoPE and image tokens, plus the vision tower
(docs/architecture/15-multimodal.md, "Qwen2.5-VL").

The decoder's step reads two more StepInputs arrays: `mrope_positions` [3, T] (the rotary positions) and
`mm_embeds` / `mm_mask` (the rows whose input embedding is an image token's encoder output). The vision tower is
`self.vision`; it runs in its own program (`encode_images`), never inside the decoder's step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.mrope import mrope_tables
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.models.qwen2_5_vl.spec import Qwen2_5_VLSpec
from vllm_jax.models.qwen2_5_vl.vision import VisionTower
from vllm_jax.models.qwen2_5_vl.vision_layout import VisionInputs
from vllm_jax.pallas_kernels.precision import model_matmuls


def encode_images(graphdef: nnx.GraphDef, state: nnx.State, batch: VisionInputs) -> jax.Array:
    """The vision tower as a pure function of the model's split state: [M, mm_embed_width] image tokens (any
    tower here: `batch` is its spec's `encoder_inputs`)."""
    with model_matmuls(state):  # pallas_kernels/precision.py
        return nnx.merge(graphdef, state).vision(batch)


class Qwen2_5_VLLM(DecoderLM):
    vision_class: type[nnx.Module] = VisionTower  # Qwen3-VL names its own (models/qwen3_vl/model.py)

    def __init__(self, spec: Qwen2_5_VLSpec, dtype=jnp.float32, *, rngs: nnx.Rngs, **kwargs):
        super().__init__(spec, dtype, rngs=rngs, **kwargs)
        self.vision = self.vision_class(spec.vision, dtype, rngs)

    def _input_embeddings(self, inputs: StepInputs) -> jax.Array:
        hidden = super()._input_embeddings(inputs)
        if inputs.mm_embeds is None:
            return hidden
        image = inputs.mm_embeds[:, :self.spec.hidden_size]  # (Qwen3-VL's DeepStack columns follow)
        return jnp.where(inputs.mm_mask[:, None], image.astype(hidden.dtype), hidden)

    def _rotary_tables(self, inputs: StepInputs) -> tuple[jax.Array, jax.Array]:
        spec = self.spec
        positions = inputs.mrope_positions
        if positions is None:  # a text-only step: the three streams are equal, which is the 1-D rope
            return super()._rotary_tables(inputs)
        return mrope_tables(spec.inv_freq, spec.mrope_section, spec.rope_attention_scaling, positions,
                            spec.mrope_interleaved)

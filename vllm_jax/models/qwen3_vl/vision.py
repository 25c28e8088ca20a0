"""Qwen3-VL's vision transformer as a Flax NNX module over stacked block params
(docs/architecture/15-multimodal.md, "Qwen3-VL").

What differs from Qwen2.5-VL's tower (models/qwen2_5_vl/vision.py): the patch embedding has a bias and adds a learned
position table resampled (bilinear, align_corners) to each image's grid; the blocks use LayerNorm and a plain
two-layer MLP; every block attends over the whole image (no windows); and DeepStack: after each block of
`deepstack_visual_indexes` a merger of its own (LayerNorm after the 2x2 concatenation) turns the block's output into
one more feature per image token. The call returns [M, hidden * (1 + K)]: the merged tokens, then the K DeepStack
features, which the decoder adds to the image rows after its first K layers (models/qwen3_vl/model.py). The rotary and
the dense masked attention are Qwen2.5-VL's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vllm_jax.model.layers import init_param, linear
from vllm_jax.models.qwen2_5_vl.vision import VISION_ACTIVATIONS, vision_attention, vision_rotary
from vllm_jax.models.qwen3_vl.spec import Qwen3VisionSpec
from vllm_jax.models.qwen3_vl.vision_layout import Qwen3VisionInputs

_EPS = 1e-6  # HF's vision LayerNorms
_BLOCK_PARAMS = ("norm1", "norm1_bias", "norm2", "norm2_bias", "qkv", "qkv_bias", "proj", "proj_bias", "fc1",
                 "fc1_bias", "fc2", "fc2_bias")


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float = _EPS) -> jax.Array:
    """torch's LayerNorm over the last axis (biased variance), normalized in float32."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype) * weight + bias


class Qwen3VisionTower(nnx.Module):
    """The vision transformer's weights (blocks and DeepStack mergers stacked on axis 0) and its forward:
    Qwen3VisionInputs -> [M, out_hidden * (1 + K)]."""

    def __init__(self, spec: Qwen3VisionSpec, dtype, rngs: nnx.Rngs):
        self.spec = spec
        d, h, i, k = spec.depth, spec.hidden_size, spec.intermediate_size, len(spec.deepstack_visual_indexes)
        merged, out = h * spec.merge_unit, spec.out_hidden_size
        self.patch_embed = init_param(rngs, (spec.patch_dim, h), dtype)
        self.patch_bias = nnx.Param(jnp.zeros((h,), dtype))
        self.pos_embed = init_param(rngs, (spec.num_position_embeddings, h), dtype)
        for name, shape, init in (("norm1", (d, h), 1.0), ("norm1_bias", (d, h), 0.0), ("norm2", (d, h), 1.0),
                                  ("norm2_bias", (d, h), 0.0), ("qkv_bias", (d, 3 * h), 0.0),
                                  ("proj_bias", (d, h), 0.0), ("fc1_bias", (d, i), 0.0), ("fc2_bias", (d, h), 0.0),
                                  ("merger_norm", (h,), 1.0), ("merger_norm_bias", (h,), 0.0),
                                  ("merger_fc1_bias", (merged,), 0.0), ("merger_fc2_bias", (out,), 0.0)):
            setattr(self, name, nnx.Param(jnp.full(shape, init, dtype)))
        self.qkv = init_param(rngs, (d, h, 3 * h), dtype)
        self.proj = init_param(rngs, (d, h, h), dtype)
        self.fc1 = init_param(rngs, (d, h, i), dtype)
        self.fc2 = init_param(rngs, (d, i, h), dtype)
        self.merger_fc1 = init_param(rngs, (merged, merged), dtype)
        self.merger_fc2 = init_param(rngs, (merged, out), dtype)
        if k:  # DeepStack mergers, stacked [K, ...]; their norm is over the concatenated 2x2 patches
            self.deepstack_norm = nnx.Param(jnp.ones((k, merged), dtype))
            self.deepstack_norm_bias = nnx.Param(jnp.zeros((k, merged), dtype))
            self.deepstack_fc1 = init_param(rngs, (k, merged, merged), dtype)
            self.deepstack_fc1_bias = nnx.Param(jnp.zeros((k, merged), dtype))
            self.deepstack_fc2 = init_param(rngs, (k, merged, out), dtype)
            self.deepstack_fc2_bias = nnx.Param(jnp.zeros((k, out), dtype))

    def __call__(self, batch: Qwen3VisionInputs) -> jax.Array:
        """[M, out_hidden * (1 + K)] merged image tokens and their DeepStack features, in the processor's order
        (padding rows after the real ones)."""
        spec = self.spec
        x = linear(jnp.asarray(batch.pixels).astype(self.patch_embed.dtype), self.patch_embed[...],
                   self.patch_bias[...])
        taps = self.pos_embed[...][jnp.asarray(batch.pos_index)]  # [P, 4, hidden]
        x = x + jnp.sum(taps * jnp.asarray(batch.pos_weight)[:, :, None].astype(taps.dtype), axis=1)
        cos, sin = vision_rotary(spec, jnp.asarray(batch.positions))
        segment = jnp.asarray(batch.image_segment)
        mask = segment[:, None] == segment[None, :]
        act = VISION_ACTIVATIONS[spec.hidden_act]

        def block(x, w):
            x = x + vision_attention(spec, w, layer_norm(x, w["norm1"], w["norm1_bias"]), cos, sin, mask)
            h = layer_norm(x, w["norm2"], w["norm2_bias"])
            return x + linear(act(linear(h, w["fc1"], w["fc1_bias"])), w["fc2"], w["fc2_bias"]), None

        blocks = {name: getattr(self, name)[...] for name in _BLOCK_PARAMS}
        features, start = [], 0
        # one scan per run of blocks between DeepStack taps (the indexes are static)
        for n, stop in enumerate((*(i + 1 for i in spec.deepstack_visual_indexes), spec.depth)):
            if stop > start:
                x, _ = jax.lax.scan(block, x, {name: value[start:stop] for name, value in blocks.items()})
            start = stop
            if n < len(spec.deepstack_visual_indexes):
                features.append(self._deepstack(n, x))
        unit = spec.hidden_size * spec.merge_unit
        merged = layer_norm(x, self.merger_norm[...], self.merger_norm_bias[...]).reshape(-1, unit)
        out = _merger_mlp(merged, self.merger_fc1[...], self.merger_fc1_bias[...], self.merger_fc2[...],
                          self.merger_fc2_bias[...])
        return jnp.concatenate([out, *features], axis=-1)

    def _deepstack(self, n: int, x: jax.Array) -> jax.Array:
        """DeepStack merger `n` on a block's output [P, hidden]: -> [P / merge_unit, out_hidden]."""
        merged = x.reshape(-1, self.spec.hidden_size * self.spec.merge_unit)
        merged = layer_norm(merged, self.deepstack_norm[n], self.deepstack_norm_bias[n])
        return _merger_mlp(merged, self.deepstack_fc1[n], self.deepstack_fc1_bias[n], self.deepstack_fc2[n],
                           self.deepstack_fc2_bias[n])


def _merger_mlp(x: jax.Array, fc1: jax.Array, fc1_bias: jax.Array, fc2: jax.Array, fc2_bias: jax.Array) -> jax.Array:
    return linear(jax.nn.gelu(linear(x, fc1, fc1_bias), approximate=False), fc2, fc2_bias)

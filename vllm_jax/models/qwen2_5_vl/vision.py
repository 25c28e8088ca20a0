"""Qwen2.5-VL's vision transformer as a Flax NNX module over stacked block params
(docs/architecture/15-multimodal.md, "The vision encoder").

Patch embedding (HF's Conv3d with stride = kernel: one matmul over the flattened patch), `depth` pre-norm
blocks (RMSNorm, 2D rope, window attention except the `fullatt_block_indexes` blocks, gated MLP with biases), and
the patch merger (RMSNorm, 2x2 patches concatenated, two linears with a GELU). Attention is dense XLA attention
over the padded bucket with a segment mask (window id or image id); no Pallas kernel yet. It runs as its own
program, apart from the decoder's step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vllm_jax.model.layers import apply_rotary, init_param, linear, rms_norm
from vllm_jax.models.qwen2_5_vl.spec import VisionSpec, VisionTowerSpec
from vllm_jax.models.qwen2_5_vl.vision_layout import VisionInputs

_EPS = 1e-6  # HF's vision RMSNorms
VISION_ACTIVATIONS = {"silu": jax.nn.silu, "gelu": lambda x: jax.nn.gelu(x, approximate=False),
                "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
                "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x)}


class VisionTower(nnx.Module):
    """The vision transformer's weights (blocks stacked on axis 0) and its forward: VisionInputs -> [M, hidden]."""

    def __init__(self, spec: VisionSpec, dtype, rngs: nnx.Rngs):
        self.spec = spec
        d, h, i = spec.depth, spec.hidden_size, spec.intermediate_size
        merged = h * spec.merge_unit
        self.patch_embed = init_param(rngs, (spec.patch_dim, h), dtype)
        self.norm1 = nnx.Param(jnp.ones((d, h), dtype))
        self.norm2 = nnx.Param(jnp.ones((d, h), dtype))
        self.qkv = init_param(rngs, (d, h, 3 * h), dtype)
        self.qkv_bias = nnx.Param(jnp.zeros((d, 3 * h), dtype))
        self.proj = init_param(rngs, (d, h, h), dtype)
        self.proj_bias = nnx.Param(jnp.zeros((d, h), dtype))
        self.gate_proj = init_param(rngs, (d, h, i), dtype)
        self.gate_bias = nnx.Param(jnp.zeros((d, i), dtype))
        self.up_proj = init_param(rngs, (d, h, i), dtype)
        self.up_bias = nnx.Param(jnp.zeros((d, i), dtype))
        self.down_proj = init_param(rngs, (d, i, h), dtype)
        self.down_bias = nnx.Param(jnp.zeros((d, h), dtype))
        self.merger_norm = nnx.Param(jnp.ones((h,), dtype))
        self.merger_fc1 = init_param(rngs, (merged, merged), dtype)
        self.merger_fc1_bias = nnx.Param(jnp.zeros((merged,), dtype))
        self.merger_fc2 = init_param(rngs, (merged, spec.out_hidden_size), dtype)
        self.merger_fc2_bias = nnx.Param(jnp.zeros((spec.out_hidden_size,), dtype))

    def __call__(self, batch: VisionInputs) -> jax.Array:
        """[M, out_hidden] merged image tokens, in the processor's order (padding rows after the real ones)."""
        spec = self.spec
        x = linear(jnp.asarray(batch.pixels).astype(self.patch_embed.dtype), self.patch_embed[...])
        cos, sin = vision_rotary(spec, jnp.asarray(batch.positions))
        window, image = jnp.asarray(batch.window_segment), jnp.asarray(batch.image_segment)
        window_mask = window[:, None] == window[None, :]
        image_mask = image[:, None] == image[None, :]
        full = jnp.asarray(np.isin(np.arange(spec.depth), spec.fullatt_block_indexes))
        blocks = {name: getattr(self, name)[...] for name in _BLOCK_PARAMS}

        def block(x, layer):
            w, is_full = layer
            mask = jnp.where(is_full, image_mask, window_mask)
            x = x + vision_attention(spec, w, rms_norm(x, w["norm1"], _EPS), cos, sin, mask)
            h = rms_norm(x, w["norm2"], _EPS)
            act = VISION_ACTIVATIONS[spec.hidden_act]
            mlp = act(linear(h, w["gate_proj"], w["gate_bias"])) * linear(h, w["up_proj"], w["up_bias"])
            return x + linear(mlp, w["down_proj"], w["down_bias"]), None

        x, _ = jax.lax.scan(block, x, (blocks, full))
        merged = rms_norm(x, self.merger_norm[...], _EPS).reshape(-1, spec.hidden_size * spec.merge_unit)
        merged = jax.nn.gelu(linear(merged, self.merger_fc1[...], self.merger_fc1_bias[...]), approximate=False)
        out = linear(merged, self.merger_fc2[...], self.merger_fc2_bias[...])
        return out[jnp.asarray(batch.merged_order)]


_BLOCK_PARAMS = ("norm1", "norm2", "qkv", "qkv_bias", "proj", "proj_bias", "gate_proj", "gate_bias", "up_proj",
                 "up_bias", "down_proj", "down_bias")


def vision_rotary(spec: VisionTowerSpec, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """HF's axial 2D rope: head_dim / 4 frequencies for the row, the same for the column, concatenated and
    repeated over the two halves: cos and sin [P, head_dim]."""
    quarter = spec.head_dim // 2
    inv = 1.0 / (spec.rope_theta ** (np.arange(0, quarter, 2, dtype=np.float32) / quarter))
    freqs = positions.astype(jnp.float32)[:, :, None] * jnp.asarray(inv.astype(np.float32))[None, None, :]
    half = jnp.concatenate([freqs[:, 0], freqs[:, 1]], axis=-1)
    emb = jnp.concatenate([half, half], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def vision_attention(spec: VisionTowerSpec, w: dict, x: jax.Array, cos: jax.Array, sin: jax.Array,
               mask: jax.Array) -> jax.Array:
    """Bidirectional attention of every patch over the patches of its segment (dense [heads, P, P] scores)."""
    p = x.shape[0]
    qkv = linear(x, w["qkv"], w["qkv_bias"]).reshape(p, 3, spec.num_heads, spec.head_dim)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    scores = jnp.einsum("qhd,khd->hqk", q, k, preferred_element_type=jnp.float32) * spec.head_dim ** -0.5
    scores = jnp.where(mask[None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("hqk,khd->qhd", probs, v, preferred_element_type=jnp.float32).astype(x.dtype)
    return linear(out.reshape(p, spec.hidden_size), w["proj"], w["proj_bias"])

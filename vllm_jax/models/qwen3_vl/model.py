"""Qwen3-VL: the Qwen3 decoder (q/k norms) with interleaved M-RoPE, image tokens and DeepStack, plus its vision
tower (docs/architecture/15-multimodal.md, "Qwen3-VL").

Everything of Qwen2.5-VL's step holds (models/qwen2_5_vl/model.py): `mrope_positions`, and the image rows of
`mm_embeds` / `mm_mask` replace the placeholder tokens' embeddings. Qwen3-VL's `mm_embeds` rows are wider
([T, hidden * (1 + K)]): after decoder layer n < K, the image rows' hidden states get column block n + 1 added
(DeepStack, transformers' `_deepstack_process`), inside the same scan over the layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vllm_jax.model.layers import LayerContext
from vllm_jax.models.qwen2_5_vl.model import Qwen2_5_VLLM
from vllm_jax.models.qwen3_vl.vision import Qwen3VisionTower


class Qwen3VLLM(Qwen2_5_VLLM):
    vision_class = Qwen3VisionTower

    def _block(self, ctx: LayerContext, w: dict, hidden: jax.Array, kv_cache: jax.Array,
               layer_index: jax.Array | int, window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
        hidden, kv_cache = super()._block(ctx, w, hidden, kv_cache, layer_index, window)
        inputs, k = ctx.inputs, self.spec.num_deepstack
        if inputs.mm_embeds is None or k == 0:
            return hidden, kv_cache
        features = inputs.mm_embeds.reshape(hidden.shape[0], 1 + k, self.spec.hidden_size)
        # the layer index may be traced (a scan over the layers): pick the block, zero past the K-th layer
        feature = jnp.take(features, jnp.minimum(layer_index, k - 1) + 1, axis=1)
        rows = inputs.mm_mask & (layer_index < k)
        return hidden + jnp.where(rows[:, None], feature.astype(hidden.dtype), 0), kv_cache

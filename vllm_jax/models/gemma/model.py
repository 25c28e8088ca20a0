"""The Gemma 2 / Gemma 3 (text) decoder: DecoderLM with Gemma's layer (docs/architecture/12-families.md, "Gemma 2 and
Gemma 3"; the differences are listed in models/gemma/spec.py).

It reuses DecoderLM's scan over stacked (or switched per-layer) params, LoRA and quantized linears, and overrides
only the layer (`_block`), the final norm / logit cap (`__call__`) and, for Gemma 3, the sliding layers' own
rotary tables (computed once per step next to the global ones, picked per layer by its window). Params beyond
DecoderLayers': `layers/pre_feedforward_norm` and `layers/post_feedforward_norm` [L, hidden]. Every norm weight
is stored as in the checkpoint (Gemma scales by 1 + weight, so they start at zero).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vllm_jax.model.aux_hidden import AuxHiddenStates
from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.layers import (
    LayerContext,
    apply_rotary,
    attention_params,
    linear,
    linear_params,
    project_qkv,
    zero_centred_rms_norm,
)
from vllm_jax.model.quantization import Quantization
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.models.gemma.spec import GemmaSpec

_ZERO_INIT_NORMS = ("input_norm", "post_attention_norm", "q_norm", "k_norm")


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
    """cap * tanh(x / cap); unchanged without a cap."""
    return x if not cap else cap * jnp.tanh(x / cap)


def geglu_mlp(w: dict, x: jax.Array) -> jax.Array:
    """down(gelu_tanh(gate(x)) * up(x)), transformers' gelu_pytorch_tanh."""
    gate = linear(x, w["gate_proj"])
    up = linear(x, w["up_proj"])
    return linear(jax.nn.gelu(gate, approximate=True) * up, w["down_proj"])


def rotary_tables_of(inv_freq: tuple[float, ...], scaling: float,
                     positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos, sin [T, head_dim] for one rope (layers.rotary_tables for frequencies other than spec.inv_freq)."""
    freqs = positions.astype(jnp.float32)[:, None] * jnp.asarray(np.array(inv_freq, np.float32))[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scaling, jnp.sin(emb) * scaling


@dataclass(frozen=True)
class GemmaContext(LayerContext):
    """LayerContext plus the sliding layers' rotary tables (Gemma 3's local rope; the global ones otherwise)."""

    local_cos: jax.Array | None = None
    local_sin: jax.Array | None = None


class GemmaLayers(nnx.Module):
    """All layers' weights stacked on axis 0: attention (q/k norms on Gemma 3), GeGLU FFN, four norms."""

    def __init__(self, spec: GemmaSpec, dtype, rngs: nnx.Rngs, quant: Quantization | None = None,
                 fuse_qkv: bool = False):
        n, h, i = spec.num_layers, spec.hidden_size, spec.intermediate_size
        params = {**attention_params(spec, dtype, rngs, quant, fuse_qkv),
                  **linear_params(rngs, "gate_proj", (n, h, i), dtype, quant),
                  **linear_params(rngs, "up_proj", (n, h, i), dtype, quant),
                  **linear_params(rngs, "down_proj", (n, i, h), dtype, quant)}
        for name in _ZERO_INIT_NORMS:
            if name in params:
                params[name] = nnx.Param(jnp.zeros_like(params[name].get_value()))
        params["pre_feedforward_norm"] = nnx.Param(jnp.zeros((n, h), dtype))
        params["post_feedforward_norm"] = nnx.Param(jnp.zeros((n, h), dtype))
        for name, param in params.items():
            setattr(self, name, param)


def gemma_attention(spec: GemmaSpec, ctx: LayerContext, w: dict, x: jax.Array, kv_cache: jax.Array,
                    layer_index: jax.Array | int, window: jax.Array | int, cos: jax.Array,
                    sin: jax.Array) -> tuple[jax.Array, jax.Array]:
    """layers.attention with Gemma's q/k norms, this layer's rotary tables and the attention soft cap."""
    t, inputs = x.shape[0], ctx.inputs
    q, k, v = project_qkv(spec, w, x)
    if spec.qk_norm:
        q = zero_centred_rms_norm(q, w["q_norm"], spec.rms_norm_eps)
        k = zero_centred_rms_norm(k, w["k_norm"], spec.rms_norm_eps)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    kv_cache = ctx.kernels.write_kv_cache(kv_cache, k, v, inputs.slot_mapping, layer_index)
    attn = ctx.kernels.attention(q, kv_cache, inputs, sm_scale=spec.sm_scale, window=window,
                                 layer_index=layer_index, soft_cap=spec.attention_soft_cap)
    return linear(attn.reshape(t, spec.q_size), w["o_proj"], w.get("o_bias")), kv_cache


def gemma_block(spec: GemmaSpec, ctx: GemmaContext, w: dict, hidden: jax.Array, kv_cache: jax.Array,
                layer_index: jax.Array | int, window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """One Gemma layer: norm -> attention -> norm -> residual; norm -> GeGLU -> norm -> residual. A sliding
    layer (window > 0) reads the local rotary tables."""
    eps = spec.rms_norm_eps
    cos, sin = ctx.cos, ctx.sin
    if spec.separate_local_rope:
        sliding = jnp.asarray(window) > 0
        cos, sin = jnp.where(sliding, ctx.local_cos, cos), jnp.where(sliding, ctx.local_sin, sin)
    x = zero_centred_rms_norm(hidden, w["input_norm"], eps)
    attn, kv_cache = gemma_attention(spec, ctx, w, x, kv_cache, layer_index, window, cos, sin)
    hidden = hidden + zero_centred_rms_norm(attn, w["post_attention_norm"], eps)
    ffn = geglu_mlp(w, zero_centred_rms_norm(hidden, w["pre_feedforward_norm"], eps))
    return hidden + zero_centred_rms_norm(ffn, w["post_feedforward_norm"], eps), kv_cache


class GemmaLM(DecoderLM):
    """Gemma 2 / Gemma 3 text: `(kv_cache, StepInputs) -> (kv_cache, logits)` like DecoderLM."""

    layers_class = GemmaLayers

    def __init__(self, spec: GemmaSpec, *args, **kwargs):
        super().__init__(spec, *args, **kwargs)
        self.final_norm = nnx.Param(jnp.zeros_like(self.final_norm.get_value()))

    def __call__(self, kv_cache: jax.Array, inputs: StepInputs, lora: dict | None = None) -> tuple[jax.Array, ...]:
        """DecoderLM.__call__ with Gemma's final norm and the final logit soft cap (float32)."""
        spec = self.spec
        kv_cache, hidden, aux = self.hidden_states(kv_cache, inputs, lora)
        last = zero_centred_rms_norm(self._logits_rows(hidden, inputs), self.final_norm[...], spec.rms_norm_eps)
        logits = soft_cap(self._logits(last, inputs), spec.final_soft_cap)
        return (kv_cache, logits) if aux is None else (kv_cache, logits, aux)

    def _run_layers(self, ctx: LayerContext, hidden: jax.Array, kv_cache: jax.Array,
                    aux: AuxHiddenStates) -> tuple[jax.Array, jax.Array, AuxHiddenStates]:
        spec = self.spec
        local = ((ctx.cos, ctx.sin) if not spec.separate_local_rope else
                 rotary_tables_of(spec.local_inv_freq, spec.local_rope_attention_scaling, ctx.inputs.positions))
        ctx = GemmaContext(**{f.name: getattr(ctx, f.name) for f in fields(LayerContext)},
                           local_cos=local[0], local_sin=local[1])
        return super()._run_layers(ctx, hidden, kv_cache, aux)

    def _block(self, ctx: GemmaContext, w: dict, hidden: jax.Array, kv_cache: jax.Array,
               layer_index: jax.Array | int, window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
        return gemma_block(self.spec, ctx, w, hidden, kv_cache, layer_index, window)

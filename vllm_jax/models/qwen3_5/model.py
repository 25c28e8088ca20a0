"""Qwen3.5 (Qwen3_5ForCausalLM): gated DeltaNet layers and gated attention layers, each followed by the SiLU MLP
(docs/architecture/12-families.md, "Qwen3.5"; the states: docs/architecture/17-state-cache.md).

What differs from the Llama decoder:

- most layers are gated DeltaNet (model/ssm/gated_deltanet.py): a recurrent mixer whose per-sequence conv and
  delta-rule states live in the HybridCache's slots, read at the start of the step and written at its end;
- the attention layers gate their output by sigmoid of a second query projection (`q_proj` yields each head's query
  then its gate), rotate only the first `partial_rotary_factor` of each head, and keep K/V in the paged cache,
  indexed by the attention layers' own order;
- every RMSNorm but the DeltaNet output's scales by (1 + weight) (`zero_centred_rms_norm`).

The loop over the two kinds of layer is model/hybrid_decoder.py's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vllm_jax.model.hybrid_decoder import HybridDecoderLM
from vllm_jax.model.layers import (
    LayerContext,
    apply_rotary,
    gated_mlp,
    linear,
    linear_params,
    zero_centred_rms_norm,
)
from vllm_jax.model.quantization import Quantization
from vllm_jax.model.ssm.gated_deltanet import gated_deltanet
from vllm_jax.model.state_cache import HybridCache
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.models.qwen3_5.spec import Qwen3_5Spec
from vllm_jax.models.qwen3_5.weights import ATTENTION_LAYERS, DELTANET_LAYERS


class Qwen3_5Layers(nnx.Module):
    """Norms and MLP stacked over every layer; attention params over the attention layers; DeltaNet params over the
    DeltaNet layers (their projections stay dense under online quantization)."""

    def __init__(self, spec: Qwen3_5Spec, dtype, rngs: nnx.Rngs, quant: Quantization | None = None,
                 fuse_qkv: bool = False):
        n, h, i, d = spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.deltanet
        na, nl = len(spec.attention_layers), len(spec.recurrent_layers)
        params = {**linear_params(rngs, "gate_proj", (n, h, i), dtype, quant),
                  **linear_params(rngs, "up_proj", (n, h, i), dtype, quant),
                  **linear_params(rngs, "down_proj", (n, i, h), dtype, quant),
                  **linear_params(rngs, "q_proj", (na, h, 2 * spec.q_size), dtype, quant),
                  **linear_params(rngs, "k_proj", (na, h, spec.kv_size), dtype, quant),
                  **linear_params(rngs, "v_proj", (na, h, spec.kv_size), dtype, quant),
                  **linear_params(rngs, "o_proj", (na, spec.q_size, h), dtype, quant),
                  **linear_params(rngs, "in_proj_qkv", (nl, h, d.conv_dim), dtype, None),
                  **linear_params(rngs, "in_proj_z", (nl, h, d.value_dim), dtype, None),
                  **linear_params(rngs, "in_proj_b", (nl, h, d.num_v_heads), dtype, None),
                  **linear_params(rngs, "in_proj_a", (nl, h, d.num_v_heads), dtype, None),
                  **linear_params(rngs, "out_proj", (nl, d.value_dim, h), dtype, None),
                  **linear_params(rngs, "conv1d", (nl, d.conv_dim, 1, d.conv_kernel), dtype, None)}
        for name, param in params.items():
            setattr(self, name, param)
        self.input_norm = nnx.Param(jnp.zeros((n, h), dtype))
        self.post_attention_norm = nnx.Param(jnp.zeros((n, h), dtype))
        self.q_norm = nnx.Param(jnp.zeros((na, spec.head_dim), dtype))
        self.k_norm = nnx.Param(jnp.zeros((na, spec.head_dim), dtype))
        self.dt_bias = nnx.Param(jnp.ones((nl, d.num_v_heads), dtype))
        self.A_log = nnx.Param(jnp.zeros((nl, d.num_v_heads), dtype))
        self.gated_norm = nnx.Param(jnp.ones((nl, d.head_v_dim), dtype))
        if spec.qkv_bias:
            self.q_bias = nnx.Param(jnp.zeros((na, 2 * spec.q_size), dtype))
            self.k_bias = nnx.Param(jnp.zeros((na, spec.kv_size), dtype))
            self.v_bias = nnx.Param(jnp.zeros((na, spec.kv_size), dtype))
        if spec.o_bias:
            self.o_bias = nnx.Param(jnp.zeros((na, h), dtype))


def partial_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate the first cos.shape[-1] dims of each head; the rest pass through."""
    width = cos.shape[-1]
    return jnp.concatenate([apply_rotary(x[..., :width], cos, sin), x[..., width:]], axis=-1)


def gated_attention(spec: Qwen3_5Spec, ctx: LayerContext, w: dict, x: jax.Array, kv_cache: jax.Array,
                    cache_layer: int) -> tuple[jax.Array, jax.Array]:
    """Qwen3.5's attention of the normed `x` [T, hidden]: per-head query and gate from `q_proj`, zero-centred q/k
    norms, partial rotary, the paged attention over the cache's `cache_layer`, output times sigmoid(gate), o_proj."""
    t, inputs, eps = x.shape[0], ctx.inputs, spec.rms_norm_eps
    query_gate = linear(x, w["q_proj"], w.get("q_bias")).reshape(t, spec.num_heads, 2 * spec.head_dim)
    q, gate = query_gate[..., :spec.head_dim], query_gate[..., spec.head_dim:].reshape(t, spec.q_size)
    k = linear(x, w["k_proj"], w.get("k_bias")).reshape(t, spec.num_kv_heads, spec.head_dim)
    v = linear(x, w["v_proj"], w.get("v_bias")).reshape(t, spec.num_kv_heads, spec.head_dim)
    q = partial_rotary(zero_centred_rms_norm(q, w["q_norm"], eps), ctx.cos, ctx.sin)
    k = partial_rotary(zero_centred_rms_norm(k, w["k_norm"], eps), ctx.cos, ctx.sin)
    kv_cache = ctx.kernels.write_kv_cache(kv_cache, k, v, inputs.slot_mapping, cache_layer)
    attn = ctx.kernels.attention(q, kv_cache, inputs, sm_scale=spec.sm_scale, window=0, layer_index=cache_layer)
    gated = attn.reshape(t, spec.q_size) * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(attn.dtype)
    return linear(gated, w["o_proj"], w.get("o_bias")), kv_cache


class Qwen3_5LM(HybridDecoderLM):
    """Qwen3_5ForCausalLM: `(HybridCache, StepInputs) -> (HybridCache, logits)`."""

    layers_class = Qwen3_5Layers
    attention_params = frozenset(ATTENTION_LAYERS)
    recurrent_params = frozenset(DELTANET_LAYERS)

    def __init__(self, spec: Qwen3_5Spec, *args, **kwargs):
        super().__init__(spec, *args, **kwargs)
        self.final_norm = nnx.Param(jnp.zeros_like(self.final_norm.get_value()))

    def __call__(self, kv_cache: HybridCache, inputs: StepInputs, lora: dict | None = None) -> tuple:
        """DecoderLM.__call__ with the zero-centred final norm."""
        kv_cache, hidden, aux = self.hidden_states(kv_cache, inputs, lora)
        last = zero_centred_rms_norm(self._logits_rows(hidden, inputs), self.final_norm[...], self.spec.rms_norm_eps)
        logits = self._logits(last, inputs)
        return (kv_cache, logits) if aux is None else (kv_cache, logits, aux)

    def _attention_layer(self, ctx: LayerContext, w: dict, hidden: jax.Array, kv: jax.Array,
                         cache_layer: int) -> tuple[jax.Array, jax.Array]:
        out, kv = gated_attention(self.spec, ctx, w, self._input_norm(w, hidden), kv, cache_layer)
        return self._mlp(w, hidden + out), kv

    def _recurrent_layer(self, w: dict, hidden: jax.Array, conv: jax.Array, recurrent: jax.Array,
                         inputs: StepInputs) -> tuple[jax.Array, jax.Array, jax.Array]:
        mixer = {"in_proj_qkv": w["in_proj_qkv"], "in_proj_z": w["in_proj_z"], "in_proj_b": w["in_proj_b"],
                 "in_proj_a": w["in_proj_a"], "conv1d": w["conv1d"][:, 0, :], "dt_bias": w["dt_bias"],
                 "A_log": w["A_log"], "norm": w["gated_norm"], "out_proj": w["out_proj"]}
        out, conv_end, recurrent_end = gated_deltanet(self.spec.deltanet, mixer, self._input_norm(w, hidden), conv,
                                                      recurrent, inputs.query_start_loc, inputs.num_seqs)
        return self._mlp(w, hidden + out), conv_end, recurrent_end

    def _input_norm(self, w: dict, hidden: jax.Array) -> jax.Array:
        return zero_centred_rms_norm(hidden, w["input_norm"], self.spec.rms_norm_eps)

    def _mlp(self, w: dict, hidden: jax.Array) -> jax.Array:
        return hidden + gated_mlp(w, zero_centred_rms_norm(hidden, w["post_attention_norm"], self.spec.rms_norm_eps))

"""Granite 4.0-H (GraniteMoeHybridForCausalLM, dense form): Mamba2 layers with a few attention layers, every layer
followed by the shared SiLU MLP (docs/architecture/12-families.md, "Granite 4.0-H"; the states:
docs/architecture/17-state-cache.md).

Granite's four multipliers (embedding, attention scale, residual branches, logits) as in models/granite/; the
attention layers have no position embedding unless `position_embedding_type` is "rope"; the Mamba2 mixer is
model/ssm/mamba2.py. The loop over the two kinds of layer is model/hybrid_decoder.py's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from vllm_jax.model.hybrid_decoder import HybridDecoderLM
from vllm_jax.model.layers import LayerContext, apply_rotary, gated_mlp, linear, linear_params, project_qkv, rms_norm
from vllm_jax.model.quantization import Quantization
from vllm_jax.model.ssm.mamba2 import mamba2_mixer
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.models.granite_hybrid.spec import GraniteHybridSpec
from vllm_jax.models.granite_hybrid.weights import ATTENTION_LAYERS, MAMBA_LAYERS

# our Mamba params -> the mixer's `w` keys (model/ssm/mamba2.py)
MIXER_KEYS = {"in_proj": "in_proj", "in_proj_bias": "in_proj_bias", "conv1d_bias": "conv1d_bias",
              "dt_bias": "dt_bias", "A_log": "A_log", "D": "D", "mamba_norm": "norm", "out_proj": "out_proj",
              "out_proj_bias": "out_proj_bias"}


class GraniteHybridLayers(nnx.Module):
    """Norms and the shared MLP stacked over every layer; attention params over the attention layers; Mamba2
    params over the Mamba layers (their projections stay dense under online quantization)."""

    def __init__(self, spec: GraniteHybridSpec, dtype, rngs: nnx.Rngs, quant: Quantization | None = None,
                 fuse_qkv: bool = False):
        n, h, i, m = spec.num_layers, spec.hidden_size, spec.shared_intermediate_size, spec.mamba
        na, nm = len(spec.attention_layers), len(spec.recurrent_layers)
        params = {**linear_params(rngs, "gate_proj", (n, h, i), dtype, quant),
                  **linear_params(rngs, "up_proj", (n, h, i), dtype, quant),
                  **linear_params(rngs, "down_proj", (n, i, h), dtype, quant),
                  **linear_params(rngs, "q_proj", (na, h, spec.q_size), dtype, quant),
                  **linear_params(rngs, "k_proj", (na, h, spec.kv_size), dtype, quant),
                  **linear_params(rngs, "v_proj", (na, h, spec.kv_size), dtype, quant),
                  **linear_params(rngs, "o_proj", (na, spec.q_size, h), dtype, quant),
                  **linear_params(rngs, "in_proj", (nm, h, m.in_proj_size), dtype, None),
                  **linear_params(rngs, "out_proj", (nm, m.intermediate_size, h), dtype, None),
                  **linear_params(rngs, "conv1d", (nm, m.conv_dim, 1, m.conv_kernel), dtype, None)}
        for name, param in params.items():
            setattr(self, name, param)
        self.input_norm = nnx.Param(jnp.ones((n, h), dtype))
        self.post_attention_norm = nnx.Param(jnp.ones((n, h), dtype))
        self.dt_bias = nnx.Param(jnp.ones((nm, m.num_heads), dtype))
        self.A_log = nnx.Param(jnp.zeros((nm, m.num_heads), dtype))
        self.D = nnx.Param(jnp.ones((nm, m.num_heads), dtype))
        self.mamba_norm = nnx.Param(jnp.ones((nm, m.intermediate_size), dtype))
        if m.use_conv_bias:
            self.conv1d_bias = nnx.Param(jnp.zeros((nm, m.conv_dim), dtype))
        if m.use_proj_bias:
            self.in_proj_bias = nnx.Param(jnp.zeros((nm, m.in_proj_size), dtype))
            self.out_proj_bias = nnx.Param(jnp.zeros((nm, h), dtype))
        if spec.qkv_bias:
            for name, width in (("q_bias", spec.q_size), ("k_bias", spec.kv_size), ("v_bias", spec.kv_size)):
                setattr(self, name, nnx.Param(jnp.zeros((na, width), dtype)))
        if spec.o_bias:
            self.o_bias = nnx.Param(jnp.zeros((na, h), dtype))


class GraniteHybridLM(HybridDecoderLM):
    """GraniteMoeHybridForCausalLM: `(HybridCache, StepInputs) -> (HybridCache, logits)`."""

    layers_class = GraniteHybridLayers
    attention_params = frozenset(ATTENTION_LAYERS)
    recurrent_params = frozenset(MAMBA_LAYERS)

    def _attention_layer(self, ctx: LayerContext, w: dict, hidden: jax.Array, kv: jax.Array,
                         cache_layer: int) -> tuple[jax.Array, jax.Array]:
        spec, inputs = self.spec, ctx.inputs
        q, k, v = project_qkv(spec, w, rms_norm(hidden, w["input_norm"], spec.rms_norm_eps))
        if spec.rotary:
            q, k = apply_rotary(q, ctx.cos, ctx.sin), apply_rotary(k, ctx.cos, ctx.sin)
        kv = ctx.kernels.write_kv_cache(kv, k, v, inputs.slot_mapping, cache_layer)
        attn = ctx.kernels.attention(q, kv, inputs, sm_scale=spec.sm_scale, window=0, layer_index=cache_layer)
        out = linear(attn.reshape(q.shape[0], spec.q_size), w["o_proj"], w.get("o_bias"))
        return self._mlp(w, self._residual(hidden, out)), kv

    def _recurrent_layer(self, w: dict, hidden: jax.Array, conv: jax.Array, recurrent: jax.Array,
                         inputs: StepInputs) -> tuple[jax.Array, jax.Array, jax.Array]:
        spec = self.spec
        mixer = {key: w[name] for name, key in MIXER_KEYS.items() if name in w}
        mixer["conv1d"] = w["conv1d"][:, 0, :]
        out, conv_end, recurrent_end = mamba2_mixer(spec.mamba, mixer, rms_norm(hidden, w["input_norm"],
                                                                                 spec.rms_norm_eps),
                                                    conv, recurrent, inputs.query_start_loc, inputs.num_seqs)
        return self._mlp(w, self._residual(hidden, out)), conv_end, recurrent_end

    def _residual(self, hidden: jax.Array, branch: jax.Array) -> jax.Array:
        """Granite's residual: the branch times `residual_multiplier`, in the hidden dtype."""
        return hidden + branch * jnp.asarray(self.spec.residual_multiplier, hidden.dtype)

    def _mlp(self, w: dict, hidden: jax.Array) -> jax.Array:
        return self._residual(hidden, gated_mlp(w, rms_norm(hidden, w["post_attention_norm"], self.spec.rms_norm_eps)))

    def _lm_head(self, last: jax.Array) -> jax.Array:
        return super()._lm_head(last) / jnp.float32(self.spec.logits_scaling)

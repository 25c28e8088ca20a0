"""gpt-oss (`GptOssForCausalLM`) as a Flax NNX module: the dense decoder's embeddings, attention and LM head with
attention sinks and gpt-oss's routed experts (models/gpt_oss/experts.py) in every layer.

Params (stacked on [num_layers]; the attention half as in DecoderLM, with q/k/v/o biases):

    layers/sinks                 [L, num_heads] float32   the learned per-head sink logits
    layers/router, router_bias   [L, H, E], [L, E]
    layers/experts_gate_up       [L, E, H, 2I]   (gate, up) interleaved on the last axis, as stored
    layers/experts_gate_up_bias  [L, E, 2I]
    layers/experts_down          [L, E, I, H]
    layers/experts_down_bias     [L, E, H]

The attention kernels take the sinks (`layers.attention` passes a layer's `sinks` param through); sliding and
full attention alternate through the per-layer windows of the scan, as for Mistral/Qwen2. The RMS norms multiply
the float32 normalized state by the weight before rounding (transformers' GptOssRMSNorm; Llama rounds first).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.layers import LayerContext, attention, attention_params, init_param
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.models.gpt_oss.experts import EXPERT_NAMES, expert_ffn, expert_parallel_ffn, route_top_logits
from vllm_jax.models.gpt_oss.spec import GptOssSpec


def gpt_oss_rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """GptOssRMSNorm: normalize and scale in float32, then round to x's dtype."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * xf).astype(x.dtype)


class GptOssLayers(nnx.Module):
    """Every layer's attention (with sinks), router and expert params, stacked on axis 0."""

    def __init__(self, spec: GptOssSpec, dtype, rngs: nnx.Rngs, quant=None, fuse_qkv: bool = False):
        n, h, e, i = spec.num_layers, spec.hidden_size, spec.num_experts, spec.intermediate_size
        params = attention_params(spec, dtype, rngs, fused=fuse_qkv)
        params["sinks"] = nnx.Param(jnp.zeros((n, spec.num_heads), jnp.float32))
        params["router"] = init_param(rngs, (n, h, e), dtype)
        params["router_bias"] = nnx.Param(jnp.zeros((n, e), dtype))
        params["experts_gate_up"] = init_param(rngs, (n, e, h, 2 * i), dtype)
        params["experts_gate_up_bias"] = nnx.Param(jnp.zeros((n, e, 2 * i), dtype))
        params["experts_down"] = init_param(rngs, (n, e, i, h), dtype)
        params["experts_down_bias"] = nnx.Param(jnp.zeros((n, e, h), dtype))
        for name, param in params.items():
            setattr(self, name, param)


class GptOssLM(DecoderLM):
    """GptOssForCausalLM; the call contract of DecoderLM. `expert_mesh` (with `expert_axis`) runs the experts
    split over that mesh axis (expert parallelism: the expert params sharded on their axis 1)."""

    layers_class = GptOssLayers
    switched_scan = False  # its scan indexes stacked params; per-layer arrays mean the unrolled loop

    def __init__(self, spec: GptOssSpec, dtype=jnp.float32, *, rngs: nnx.Rngs, attention_backend: str = "auto",
                 platform: str | None = None, mesh: Mesh | None = None, expert_mesh: Mesh | None = None,
                 expert_axis: str = "model", quantization=None, quantization_group_size: int | None = None):
        if quantization is not None:
            scheme = getattr(quantization, "scheme", None) or quantization
            raise ValueError(f"{spec.architecture}: --quantization {scheme} is not supported for gpt-oss yet (its "
                             f"experts are float only)")
        super().__init__(spec, dtype, rngs=rngs, attention_backend=attention_backend, platform=platform, mesh=mesh)
        self.expert_mesh = expert_mesh
        self.expert_axis = expert_axis

    def __call__(self, kv_cache: jax.Array, inputs: StepInputs, lora: dict | None = None) -> tuple[jax.Array, ...]:
        if lora:
            raise ValueError("LoRA adapters are not supported for gpt-oss")
        kv_cache, hidden, aux = self.hidden_states(kv_cache, inputs)
        last = gpt_oss_rms_norm(self._logits_rows(hidden, inputs), self.final_norm[...], self.spec.rms_norm_eps)
        logits = self._logits(last, inputs)
        return (kv_cache, logits) if aux is None else (kv_cache, logits, aux)

    def _experts(self, w: dict, x: jax.Array) -> jax.Array:
        spec = self.spec
        weights, ids = route_top_logits(x, w["router"], w["router_bias"], spec.num_experts_per_tok)
        experts = tuple(w[name] for name in EXPERT_NAMES)
        swiglu = dict(alpha=spec.swiglu_alpha, limit=spec.swiglu_limit)
        if self.expert_mesh is not None and self.expert_mesh.shape[self.expert_axis] > 1:
            out = expert_parallel_ffn(self.expert_mesh, self.expert_axis, x, weights, ids, experts, **swiglu)
        else:
            out = expert_ffn(x, weights, ids, *experts, **swiglu)
        return out.astype(x.dtype)

    def _block(self, ctx: LayerContext, w: dict, hidden: jax.Array, kv_cache: jax.Array,
               layer_index: jax.Array | int, window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
        """One pre-norm layer: attention (with the layer's sinks), then the experts, each with its residual."""
        eps = self.spec.rms_norm_eps
        attn, kv_cache = attention(self.spec, ctx, w, gpt_oss_rms_norm(hidden, w["input_norm"], eps), kv_cache,
                                   layer_index, window)
        hidden = hidden + attn
        hidden = hidden + self._experts(w, gpt_oss_rms_norm(hidden, w["post_attention_norm"], eps))
        return hidden, kv_cache

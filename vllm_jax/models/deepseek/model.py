"""DeepSeek-V2 / V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`): multi-head latent attention
(models/deepseek/mla.py) over a latent KV cache, dense MLPs for the first `first_k_dense_replace` layers, then MoE
layers of routed experts (model/moe.py's grouped expert FFN) plus always-on shared experts, with DeepSeek's routing
(models/deepseek/routing.py).

Params (stacked; the MLA attention half on every layer, models/deepseek/mla.py):

    layers/router            [num_moe_layers, hidden, num_experts]
    layers/e_score_bias      [num_moe_layers, num_experts]   (V3's e_score_correction_bias)
    layers/experts_{gate,up,down}                            (as MoeLM's)
    layers/shared_{gate,up}  [num_moe_layers, hidden, shared_size]; shared_down [., shared_size, hidden]
    layers/{gate,up,down}_proj                               (the dense first layers, as MoeLM's)

The layer loop is MoeLM's (one scan per run of same-kind layers) with the MLA block (`_block`). Attention runs
the backend's MLA kernel: the XLA path, or the Pallas TPU / GPU MLA kernels (docs/architecture/12-families.md, "DeepSeek
MLA"). Weight quantization, LoRA and EAGLE-3 are not supported for these models yet.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from vllm_jax.model.layers import LayerContext, Mlp, gated_mlp, init_param
from vllm_jax.model.moe import EXPERT_PARAMS, MLP_PARAMS, MoeLM, routed_experts
from vllm_jax.model.quantization import Quantization
from vllm_jax.model.weight_forms.bundle import bundle_experts
from vllm_jax.models.deepseek.mla import mla_attention_params, mla_decoder_block
from vllm_jax.models.deepseek.routing import deepseek_route
from vllm_jax.models.deepseek.spec import MlaSpec

SHARED_PARAMS = ("shared_gate", "shared_up", "shared_down")


class DeepseekLayers(nnx.Module):
    """MLA params for every layer; router, bias, routed and shared experts for the MoE layers; a dense MLP for the
    first ones."""

    def __init__(self, spec: MlaSpec, dtype, rngs: nnx.Rngs, quant: Quantization | None = None,
                 fuse_qkv: bool = False):
        del quant, fuse_qkv  # quantization is refused by DeepseekLM; MLA has no q/k/v to fuse
        h, e, i = spec.hidden_size, spec.num_experts, spec.intermediate_size
        params = mla_attention_params(spec, dtype, rngs)
        m = len(spec.moe_layer_ids)
        if m:
            params["router"] = init_param(rngs, (m, h, e), dtype)
            if spec.topk_method == "noaux_tc":
                params["e_score_bias"] = nnx.Param(jnp.zeros((m, e), dtype))
            params["experts_gate"] = init_param(rngs, (m, e, h, i), dtype)
            params["experts_up"] = init_param(rngs, (m, e, h, i), dtype)
            params["experts_down"] = init_param(rngs, (m, e, i, h), dtype)
            s = spec.shared_intermediate_size
            if s:
                params["shared_gate"] = init_param(rngs, (m, h, s), dtype)
                params["shared_up"] = init_param(rngs, (m, h, s), dtype)
                params["shared_down"] = init_param(rngs, (m, s, h), dtype)
        d, di = len(spec.dense_layer_ids), spec.dense_intermediate_size
        if d:
            params["gate_proj"] = init_param(rngs, (d, h, di), dtype)
            params["up_proj"] = init_param(rngs, (d, h, di), dtype)
            params["down_proj"] = init_param(rngs, (d, di, h), dtype)
        for name, param in params.items():
            setattr(self, name, param)


class DeepseekLM(MoeLM):
    """Same call contract as DecoderLM: `(kv_cache, StepInputs) -> (kv_cache, float32 logits [S, vocab])`, over
    the MLA latent cache [num_layers, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]."""

    layers_class = DeepseekLayers
    fuses_projections = False
    mlp_param_set = MLP_PARAMS | frozenset(SHARED_PARAMS + ("e_score_bias",))

    def __init__(self, spec: MlaSpec, dtype=jnp.float32, *, rngs: nnx.Rngs, attention_backend: str = "auto",
                 platform: str | None = None, mesh: Mesh | None = None, expert_mesh: Mesh | None = None,
                 expert_axis: str = "model", quantization: str | None = None,
                 quantization_group_size: int | None = None):
        if quantization is not None:
            name = getattr(quantization, "scheme", None) or ("gguf" if not isinstance(quantization, str) else
                                                             quantization)
            raise ValueError(f"{spec.architecture}: weight quantization ({name}) is not supported for MLA models "
                             f"yet; drop --quantization")
        super().__init__(spec, dtype, rngs=rngs, attention_backend=attention_backend, platform=platform, mesh=mesh,
                         expert_mesh=expert_mesh, expert_axis=expert_axis)

    def _block(self, ctx: LayerContext, w: dict, mlp: Mlp, hidden: jax.Array, kv_cache: jax.Array,
               layer_index: jax.Array | int, window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
        del window  # DeepSeek has no sliding windows
        return mla_decoder_block(self.spec, ctx, w, mlp, hidden, kv_cache, layer_index)

    def _moe_mlp(self, w: dict, x: jax.Array) -> jax.Array:
        """Routed experts (weights already times routed_scaling_factor) plus the shared experts."""
        weights, ids = deepseek_route(self.spec, x, w["router"], w.get("e_score_bias"))
        out = routed_experts(self.expert_mesh, self.expert_axis, x, weights, ids,
                             tuple(w[name] for name in EXPERT_PARAMS))
        if "shared_gate" in w:
            shared = {"gate_proj": w["shared_gate"], "up_proj": w["shared_up"], "down_proj": w["shared_down"]}
            out = out + gated_mlp(shared, x)
        return out

    def _mlp(self, is_moe: bool, w: dict, ctx: LayerContext, layer_index: jax.Array | int) -> Mlp:
        """Unquantized, no LoRA (both refused): the plain expert stacks, or the dense MLP."""
        del ctx, layer_index
        if not is_moe:
            return partial(gated_mlp, w)
        return partial(self._moe_mlp, bundle_experts(w, EXPERT_PARAMS, None))

    def _mlp_param_names(self, is_moe: bool) -> tuple[str, ...]:
        if not is_moe:
            return ("gate_proj", "up_proj", "down_proj")
        present = set(vars(self.layers))
        extra = tuple(name for name in ("e_score_bias",) + SHARED_PARAMS if name in present)
        return ("router",) + EXPERT_PARAMS + extra

"""Gemma 4's MoE block (`enable_moe_block`, gemma-4-26B-A4B): routed experts beside every layer's dense MLP.

As transformers' Gemma4TextDecoderLayer does it, on the pre-MLP residual r
(docs/architecture/12-families.md, "Gemma 4"):

    mlp   = post_feedforward_norm_1(GeGLU(pre_feedforward_norm(r)))
    moe   = post_feedforward_norm_2(experts(pre_feedforward_norm_2(r)))
    layer output adds post_feedforward_norm(mlp + moe) to r

The router (Gemma4TextRouter) reads r through an RMSNorm without scale, times `router_norm` (the checkpoint's
router.scale: a name ending in `_scale` would read as a quantization scale to the loader) and hidden**-0.5,
then the router matrix in the model dtype -> float32 softmax -> top-k -> renormalized to sum 1 -> times the
chosen experts' `per_expert_scale`. The experts (Gemma4TextExperts) are GeGLU FFNs: the checkpoint's fused
gate_up_proj [E, 2I, H] (gate the first I rows) is split at load into `experts_gate` / `experts_up` [E, H, I]
(models/gemma4/weights.py), so they run through moe.py's grouped expert FFN with a tanh-GELU, and expert
parallelism is moe.py's: each device its slab of experts, one psum.

Params per layer group (models/gemma4/model.py stacks them; names `{group}_{name}`): router [n, H, E], router_norm
[n, H], per_expert_scale [n, E], experts_gate / experts_up [n, E, H, I], experts_down [n, E, I, H], and the norms
pre_feedforward_norm_2, post_feedforward_norm_1, post_feedforward_norm_2 [n, H].
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from vllm_jax.model.moe import EXPERT_PARAMS, route, routed_experts
from vllm_jax.model.weight_forms.bundle import bundle_experts
from vllm_jax.models.gemma4.spec import Gemma4Spec

NORMS = ("pre_feedforward_norm_2", "post_feedforward_norm_1", "post_feedforward_norm_2")
MATRICES = ("router",) + EXPERT_PARAMS  # random-initialized (the rest start at one, as transformers')
_GELU_TANH = partial(jax.nn.gelu, approximate=True)  # gelu_pytorch_tanh, the only hidden_activation accepted


def moe_shapes(spec: Gemma4Spec, n: int) -> dict[str, tuple[int, ...]]:
    """name -> stacked shape of the MoE params of a group of n layers (empty without the block)."""
    if spec.num_experts is None:
        return {}
    h, e, i = spec.hidden_size, spec.num_experts, spec.moe_intermediate_size
    shapes = {"router": (n, h, e), "router_norm": (n, h), "per_expert_scale": (n, e),
              "experts_gate": (n, e, h, i), "experts_up": (n, e, h, i), "experts_down": (n, e, i, h)}
    return shapes | {norm: (n, h) for norm in NORMS}


def moe_block(spec: Gemma4Spec, w: dict, residual: jax.Array, rms_norm, expert_mesh: Mesh | None,
              expert_axis: str) -> jax.Array:
    """The experts' output for the pre-MLP residual [T, H], before post_feedforward_norm_2, in its dtype.
    `rms_norm(x, weight_or_None, eps)`: Gemma 4's norm (models/gemma4/model.py)."""
    eps, dtype = spec.rms_norm_eps, residual.dtype
    router_in = rms_norm(residual, None, eps) * w["router_norm"].astype(dtype)
    router_in = router_in * jnp.asarray(spec.hidden_size ** -0.5, dtype)
    weights, ids = route(router_in, w["router"], spec.num_experts_per_tok, normalize=True,
                         round_to_model_dtype=False)
    weights = weights * w["per_expert_scale"].astype(jnp.float32)[ids]
    x = rms_norm(residual, w["pre_feedforward_norm_2"], eps)
    stacks = bundle_experts(w, EXPERT_PARAMS, None)  # unquantized: Gemma4LM refuses --quantization
    return routed_experts(expert_mesh, expert_axis, x, weights, ids, tuple(stacks[name] for name in EXPERT_PARAMS),
                          _GELU_TANH)

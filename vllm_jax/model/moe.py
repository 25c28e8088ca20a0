"""Mixture-of-experts decoder (Mixtral, Qwen3-MoE): the dense decoder's attention with a routed expert FFN.

Params (all stacked; `layers/*` as in DecoderLM for the attention half):

    layers/router        [num_moe_layers, hidden, num_experts]
    layers/experts_gate  [num_moe_layers, num_experts, hidden, expert_ffn]
    layers/experts_up    [num_moe_layers, num_experts, hidden, expert_ffn]
    layers/experts_down  [num_moe_layers, num_experts, expert_ffn, hidden]
    layers/gate_proj, up_proj, down_proj   [num_dense_layers, ...]  only for Qwen3-MoE's dense layers

One MoE block: router logits (in the model dtype, as transformers' Linear) -> float32 softmax -> top-k ->
optional renormalization (`route`); then `grouped_expert_ffn`: the T*k (token, expert) assignments are sorted
by expert, the tokens gathered in that order, and gate/up/down run as `jax.lax.ragged_dot` over the expert
groups (no expert is applied to tokens not routed to it), then the rows are unsorted and combined with the
routing weights in float32.

Quantized (`--quantization`, model/quantization.py): the experts' values [L, E, in, out] carry scales
`layers/experts_*_scale` [L, E, out]. The grouped matmuls are weight-only on every platform (the values converted
to the activation dtype inside `ragged_dot`, each row's output scaled by its expert's channel scales); the router
stays in the model dtype.

Expert parallelism: `grouped_expert_ffn` takes any contiguous slab of experts (`expert_offset`) and ignores
assignments to experts outside it, so the same function runs per device under `shard_map` with the expert
axis of the weights split over a mesh axis; `expert_parallel_ffn` does that (tokens replicated, each device
computes its experts' share, one psum combines). The model uses it when `expert_mesh` is set.

On CPU, XLA lowers `ragged_dot` to a masked dense product over the groups (a jax fallback). TPU gets a real
grouped matmul. XLA:GPU (jaxlib 0.10.2) lowers it like CPU: a select over [experts here, rows, hidden] and a
dense product, so a GPU step costs the local experts' count times the flops, and the 8192-token bucket of
Qwen3-30B-A3B needs 17 GB of temporaries at EP 2 (seen by `vllm-jax compile-check`; docs/accelerators.md, "Ahead-of-time
compile checks"). A grouped-matmul kernel for GPU is the fix, not yet written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from vllm_jax.model import layer_loop
from vllm_jax.model.aux_hidden import AuxHiddenStates
from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.layers import (
    LayerContext,
    Mlp,
    attention_params,
    decoder_block,
    gated_mlp,
    init_param,
    is_unstacked,
    layer_param_values,
    linear_params,
)
from vllm_jax.model.lora_layers import ExpertLoRA, bundle_lora
from vllm_jax.model.moe_spec import MoeSpec
from vllm_jax.model.quantization import Quantization, scale_name
from vllm_jax.model.weight_forms.bundle import bundle_quantized

EXPERT_PARAMS = ("experts_gate", "experts_up", "experts_down")
DENSE_MLP_PARAMS = ("gate_proj", "up_proj", "down_proj")
_MLP_PARAMS = frozenset(("router",) + EXPERT_PARAMS + DENSE_MLP_PARAMS
                        + tuple(scale_name(n) for n in EXPERT_PARAMS + DENSE_MLP_PARAMS))
ExpertScales = tuple[jax.Array, jax.Array, jax.Array]  # gate, up, down: [E_here, out] float32 each


def route(x: jax.Array, router: jax.Array, top_k: int, normalize: bool,
          round_to_model_dtype: bool) -> tuple[jax.Array, jax.Array]:
    """-> (float32 weights [T, k], int32 expert ids [T, k]), in transformers' order of operations."""
    logits = jnp.dot(x, router, preferred_element_type=jnp.float32).astype(x.dtype)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, ids = jax.lax.top_k(probs, top_k)
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    if round_to_model_dtype:
        weights = weights.astype(x.dtype).astype(jnp.float32)
    return weights, ids.astype(jnp.int32)


def grouped_expert_ffn(x: jax.Array, weights: jax.Array, expert_ids: jax.Array, w_gate: jax.Array,
                       w_up: jax.Array, w_down: jax.Array, expert_offset: jax.Array | int = 0,
                       scales: ExpertScales | None = None,
                       activation: Callable[[jax.Array], jax.Array] = jax.nn.silu,
                       lora: ExpertLoRA | None = None) -> jax.Array:
    """sum_k weights[t, k] * FFN_{expert_ids[t, k]}(x[t]) over the experts held here -> float32 [T, hidden].

    x [T, H]; weights [T, k] float32; expert_ids [T, k]; w_gate, w_up [E_here, H, I]; w_down [E_here, I, H],
    holding global experts expert_offset .. expert_offset + E_here - 1. Assignments to other experts add 0.
    `scales`: the weights are quantized values and these their per-expert channel scales (weight-only).
    `activation` applies to the gate: SiLU (SwiGLU: Mixtral, Qwen3-MoE, DeepSeek), tanh-GELU (GeGLU: Gemma 4).
    `lora`: the experts' adapter slots (held here), each row's delta added to gate, up and down.
    """
    groups = ExpertGroups.of(expert_ids, w_gate.shape[0], expert_offset)
    row_token = groups.order // expert_ids.shape[1]
    xs = x[row_token]  # [T*k, H], grouped by expert
    s_gate, s_up, s_down = scales if scales is not None else (None, None, None)

    def project(which: int, rows: jax.Array, w: jax.Array, scale: jax.Array | None) -> jax.Array:
        y = _grouped_matmul(rows, w, scale, groups.sizes, groups.row_expert)
        if lora is None:
            return y
        return (y.astype(jnp.float32) + lora.delta(which, rows, groups.sizes, row_token)).astype(rows.dtype)

    gate, up = project(0, xs, w_gate, s_gate), project(1, xs, w_up, s_up)
    out = project(2, activation(gate) * up, w_down, s_down)
    return groups.combine(out, weights)


@dataclass(frozen=True)
class ExpertGroups:
    """The T*k (token, expert) assignments sorted by the expert held here (`of`), and the way back (`combine`);
    shared by every grouped expert FFN (this module's, model/gpt_oss_experts.py's)."""

    order: jax.Array  # [T*k] assignment index of each sorted row
    sizes: jax.Array  # [E_here] int32 rows per local expert (ragged_dot's group_sizes)
    row_expert: jax.Array  # [T*k] local expert of each sorted row (rows of other experts: the last; masked)
    held: jax.Array  # [T*k] the assignment's expert is held here

    @staticmethod
    def of(expert_ids: jax.Array, num_here: int, expert_offset: jax.Array | int = 0) -> ExpertGroups:
        local = expert_ids.reshape(-1) - expert_offset
        held = (local >= 0) & (local < num_here)
        group = jnp.where(held, local, num_here)  # assignments for other experts sort last, outside every group
        order = jnp.argsort(group, stable=True)
        sizes = jnp.bincount(group, length=num_here + 1)[:num_here].astype(jnp.int32)
        return ExpertGroups(order, sizes, jnp.minimum(group[order], num_here - 1), held)

    def combine(self, out: jax.Array, weights: jax.Array) -> jax.Array:
        """Sorted rows [T*k, H] back to (token, slot) order, times their routing weights [T, k] (float32),
        summed over the slots -> float32 [T, H]; assignments to experts not held here add 0."""
        t, k = weights.shape
        inverse = jnp.zeros_like(self.order).at[self.order].set(jnp.arange(t * k, dtype=self.order.dtype))
        out = out[inverse].astype(jnp.float32)
        contrib = jnp.where(self.held[:, None], out * weights.reshape(-1, 1), 0.0)
        return contrib.reshape(t, k, -1).sum(axis=1)


def _grouped_matmul(xs: jax.Array, w: jax.Array, scale: jax.Array | None, group_sizes: jax.Array,
                    row_expert: jax.Array) -> jax.Array:
    """One grouped matmul in xs's dtype; quantized values (with `scale`) are converted inside it and each row's
    output scaled by its expert's channel scales."""
    if scale is None:
        return jax.lax.ragged_dot(xs, w, group_sizes, preferred_element_type=jnp.float32).astype(xs.dtype)
    y = jax.lax.ragged_dot(xs, w.astype(xs.dtype), group_sizes, preferred_element_type=jnp.float32)
    return (y * scale[row_expert]).astype(xs.dtype)


def expert_parallel_ffn(mesh: Mesh, axis: str, x: jax.Array, weights: jax.Array, expert_ids: jax.Array,
                        w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array,
                        scales: ExpertScales | None = None,
                        activation: Callable[[jax.Array], jax.Array] = jax.nn.silu,
                        lora: ExpertLoRA | None = None) -> jax.Array:
    """`grouped_expert_ffn` with the expert axis of the weights (and their scales, and the adapter slots' axis 1)
    split over `mesh` axis `axis`: tokens and routing are replicated, each device runs its own experts, a psum
    combines the partial outputs."""

    def local(x, weights, expert_ids, lora, w_gate, w_up, w_down, *scales):
        offset = jax.lax.axis_index(axis) * w_gate.shape[0]
        partial_out = grouped_expert_ffn(x, weights, expert_ids, w_gate, w_up, w_down, offset, scales or None,
                                         activation, lora)
        return jax.lax.psum(partial_out, axis)

    extra = tuple(scales) if scales is not None else ()
    experts = P(axis)
    lora_specs = None if lora is None else ExpertLoRA((P(None, axis),) * 3, (P(None, axis),) * 3, P(), P())
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), lora_specs) + (experts,) * (3 + len(extra)),
                         out_specs=P())(x, weights, expert_ids, lora, w_gate, w_up, w_down, *extra)


class MoeLayers(nnx.Module):
    """Attention params for every layer; expert/router params for the MoE layers; dense MLP params for the rest."""

    def __init__(self, spec: MoeSpec, dtype, rngs: nnx.Rngs, quant: Quantization | None = None,
                 fuse_qkv: bool = False):
        h, e, i = spec.hidden_size, spec.num_experts, spec.intermediate_size
        params = attention_params(spec, dtype, rngs, quant, fuse_qkv)
        m = len(spec.moe_layer_ids)
        if m:
            params["router"] = init_param(rngs, (m, h, e), dtype)
            params |= linear_params(rngs, "experts_gate", (m, e, h, i), dtype, quant)
            params |= linear_params(rngs, "experts_up", (m, e, h, i), dtype, quant)
            params |= linear_params(rngs, "experts_down", (m, e, i, h), dtype, quant)
        d, di = len(spec.dense_layer_ids), spec.dense_intermediate_size
        if d:
            params |= linear_params(rngs, "gate_proj", (d, h, di), dtype, quant)
            params |= linear_params(rngs, "up_proj", (d, h, di), dtype, quant)
            params |= linear_params(rngs, "down_proj", (d, di, h), dtype, quant)
        for name, param in params.items():
            setattr(self, name, param)


class MoeLM(DecoderLM):
    """MixtralForCausalLM / Qwen3MoeForCausalLM. Same call contract as DecoderLM:
    `(kv_cache, StepInputs) -> (kv_cache, float32 logits [S, vocab])`.

    `expert_mesh` (with `expert_axis`) switches the expert FFN to `expert_parallel_ffn`; the expert weights
    must then be sharded on their expert axis (axis 1 of the stacked [L, E, ...] params) over that mesh axis.
    """

    layers_class = MoeLayers
    switched_scan = False  # its scans index stacked params; per-layer arrays mean the unrolled loop
    mlp_param_set = _MLP_PARAMS  # the layer params indexed by a layer's place in its kind's stack, not its index

    def __init__(self, spec: MoeSpec, dtype=jnp.float32, *, rngs: nnx.Rngs, attention_backend: str = "auto",
                 platform: str | None = None, mesh: Mesh | None = None, expert_mesh: Mesh | None = None,
                 expert_axis: str = "model", quantization: str | None = None,
                 quantization_group_size: int | None = None):
        super().__init__(spec, dtype, rngs=rngs, attention_backend=attention_backend, platform=platform, mesh=mesh,
                         quantization=quantization, quantization_group_size=quantization_group_size)
        self.expert_mesh = expert_mesh
        self.expert_axis = expert_axis

    def _moe_mlp(self, w: dict, x: jax.Array) -> jax.Array:
        spec = self.spec
        weights, ids = route(x, w["router"], spec.num_experts_per_tok, spec.norm_topk_prob,
                             spec.round_router_weights)
        experts = tuple(w[name] for name in EXPERT_PARAMS)
        scales = None if self.quantization is None else tuple(w[scale_name(name)] for name in EXPERT_PARAMS)
        lora = w.get("expert_lora")
        if self.expert_mesh is not None and self.expert_mesh.shape[self.expert_axis] > 1:
            out = expert_parallel_ffn(self.expert_mesh, self.expert_axis, x, weights, ids, *experts, scales,
                                      lora=lora)
        else:
            out = grouped_expert_ffn(x, weights, ids, *experts, scales=scales, lora=lora)
        return out.astype(x.dtype)

    def _run_layers(self, ctx: LayerContext, hidden: jax.Array, kv_cache: jax.Array,
                    aux: AuxHiddenStates) -> tuple[jax.Array, jax.Array, AuxHiddenStates]:
        """One scan per run of consecutive same-kind layers (a single scan when every layer is MoE); over
        per-layer arrays (see layers.unstack_layers) the same runs as a Python loop (model/layer_loop.py). A layer
        indexes the attention params by its global index and its FFN's by its position in its own kind's stack."""
        params = layer_param_values(self.layers)
        attn = {name: value for name, value in params.items() if name not in self.mlp_param_set}
        carry = (hidden, kv_cache, aux)
        for is_moe, layer_ids, mlp_ids in _layer_runs(self.spec.moe_layers):
            names = self._mlp_param_names(is_moe)

            def step(layer_input, layer_index, hidden, kv_cache, is_moe=is_moe, names=names):
                mlp_index, window = layer_input
                w = bundle_quantized({name: value[layer_index] for name, value in attn.items()}, self.quantization)
                w = bundle_lora(w, ctx.lora, ctx.lora_mask, layer_index)
                mlp_w = {name: params[name][mlp_index] for name in names}
                if is_moe and ctx.lora and "experts_gate" in ctx.lora:  # the experts' adapter slots, global index
                    mlp_w["expert_lora"] = ExpertLoRA.of(ctx.lora, ctx.lora_mask, layer_index, EXPERT_PARAMS)
                mlp = self._mlp(is_moe, mlp_w)
                return self._block(ctx, w, mlp, hidden, kv_cache, layer_index, window)

            windows = [self.spec.sliding_windows[i] for i in layer_ids]
            if is_unstacked(params):
                carry = layer_loop.unrolled(step, zip(zip(mlp_ids, windows), layer_ids), carry)
            else:
                xs = (jnp.asarray(np.array(mlp_ids, np.int32)), jnp.asarray(np.array(windows, np.int32)))
                carry = layer_loop.scan(step, xs, jnp.asarray(np.array(layer_ids, np.int32)), carry)
        return carry

    def _block(self, ctx: LayerContext, w: dict, mlp: Mlp, hidden: jax.Array, kv_cache: jax.Array,
               layer_index: jax.Array | int, window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
        """One layer (attention, then `mlp`); families with another attention override it."""
        return decoder_block(self.spec, ctx, w, mlp, hidden, kv_cache, layer_index, window)

    def _mlp(self, is_moe: bool, w: dict) -> Mlp:
        """The layer's FFN over its own params: the routed experts, or the dense gated MLP."""
        w = bundle_quantized(w, self.quantization)
        return partial(self._moe_mlp, w) if is_moe else partial(gated_mlp, w)

    def _mlp_param_names(self, is_moe: bool) -> tuple[str, ...]:
        names = EXPERT_PARAMS if is_moe else DENSE_MLP_PARAMS
        scales = tuple(scale_name(n) for n in names) if self.quantization is not None else ()
        return (("router",) if is_moe else ()) + names + scales


def _layer_runs(moe_layers: tuple[bool, ...]) -> list[tuple[bool, list[int], list[int]]]:
    """Maximal runs of same-kind layers: (is_moe, global layer ids, ids within that kind's param stack)."""
    runs: list[tuple[bool, list[int], list[int]]] = []
    counts = {True: 0, False: 0}
    for layer, is_moe in enumerate(moe_layers):
        if not runs or runs[-1][0] != is_moe:
            runs.append((is_moe, [], []))
        runs[-1][1].append(layer)
        runs[-1][2].append(counts[is_moe])
        counts[is_moe] += 1
    return runs

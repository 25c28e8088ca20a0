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

Each layer's expert stacks reach the FFN as forms (model/weight_forms/experts.py, picked by
`bundle.bundle_experts`, LoRA-wrapped by `lora_layers.bundle_expert_lora`) that do their own grouped matmul.
Quantized (`--quantization`, model/quantization.py): the experts' values [L, E, in, out] carry scales
`layers/experts_*_scale` [L, E, out], weight-only on every platform (ChannelScaledExperts); the router stays in
the model dtype.

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
from vllm_jax.model.lora_layers import bundle_expert_lora, bundle_lora
from vllm_jax.model.moe_spec import MoeSpec
from vllm_jax.model.quantization import Quantization, scale_name
from vllm_jax.model.weight_forms.bundle import bundle_experts, bundle_quantized
from vllm_jax.model.weight_forms.experts import ExpertGroups, ExpertStack, as_expert_stack

EXPERT_PARAMS = ("experts_gate", "experts_up", "experts_down")
DENSE_MLP_PARAMS = ("gate_proj", "up_proj", "down_proj")
MLP_PARAMS = frozenset(("router",) + EXPERT_PARAMS + DENSE_MLP_PARAMS
                        + tuple(scale_name(n) for n in EXPERT_PARAMS + DENSE_MLP_PARAMS))


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


def grouped_expert_ffn(x: jax.Array, weights: jax.Array, expert_ids: jax.Array, w_gate: ExpertStack | jax.Array,
                       w_up: ExpertStack | jax.Array, w_down: ExpertStack | jax.Array,
                       expert_offset: jax.Array | int = 0,
                       activation: Callable[[jax.Array], jax.Array] = jax.nn.silu) -> jax.Array:
    """sum_k weights[t, k] * FFN_{expert_ids[t, k]}(x[t]) over the experts held here -> float32 [T, hidden].

    x [T, H]; weights [T, k] float32; expert_ids [T, k]; w_gate, w_up [E_here, H, I]; w_down [E_here, I, H] as
    expert stacks (model/weight_forms/experts.py: plain, int8 / fp8 with channel scales, LoRA-wrapped; a plain
    array is a plain stack), holding global experts expert_offset .. expert_offset + E_here - 1. Assignments to
    other experts add 0. `activation` applies to the gate: SiLU (SwiGLU: Mixtral, Qwen3-MoE, DeepSeek), tanh-GELU
    (GeGLU: Gemma 4).
    """
    gate_stack, up_stack, down_stack = (as_expert_stack(w) for w in (w_gate, w_up, w_down))
    groups = ExpertGroups.of(expert_ids, gate_stack.num_experts, expert_offset)
    xs = x[groups.row_token]  # [T*k, H], grouped by expert
    gate, up = gate_stack.grouped_linear(xs, groups), up_stack.grouped_linear(xs, groups)
    out = down_stack.grouped_linear(activation(gate) * up, groups)
    return groups.combine(out, weights)


def expert_parallel_ffn(mesh: Mesh, axis: str, x: jax.Array, weights: jax.Array, expert_ids: jax.Array,
                        w_gate: ExpertStack | jax.Array, w_up: ExpertStack | jax.Array,
                        w_down: ExpertStack | jax.Array,
                        activation: Callable[[jax.Array], jax.Array] = jax.nn.silu) -> jax.Array:
    """`grouped_expert_ffn` with the expert axis of the stacks (each form's arrays: values, scales, the adapter
    slots' axis 1) split over `mesh` axis `axis`: tokens and routing are replicated, each device runs its own
    experts, a psum combines the partial outputs."""
    stacks = tuple(as_expert_stack(w) for w in (w_gate, w_up, w_down))

    def local(x, weights, expert_ids, stacks):
        offset = jax.lax.axis_index(axis) * stacks[0].num_experts
        return jax.lax.psum(grouped_expert_ffn(x, weights, expert_ids, *stacks, offset, activation), axis)

    specs = tuple(stack.expert_axis_specs(axis) for stack in stacks)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), specs), out_specs=P())(x, weights, expert_ids,
                                                                                          stacks)


def routed_experts(expert_mesh: Mesh | None, expert_axis: str, x: jax.Array, weights: jax.Array,
                   expert_ids: jax.Array, stacks: tuple[ExpertStack, ExpertStack, ExpertStack],
                   activation: Callable[[jax.Array], jax.Array] = jax.nn.silu) -> jax.Array:
    """The routed experts' output in x's dtype: split over `expert_mesh`'s `expert_axis` when it has more than one
    device there (expert parallelism), else all here."""
    if expert_mesh is not None and expert_mesh.shape[expert_axis] > 1:
        out = expert_parallel_ffn(expert_mesh, expert_axis, x, weights, expert_ids, *stacks, activation)
    else:
        out = grouped_expert_ffn(x, weights, expert_ids, *stacks, activation=activation)
    return out.astype(x.dtype)


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
    mlp_param_set = MLP_PARAMS  # the layer params indexed by a layer's place in its kind's stack, not its index

    def __init__(self, spec: MoeSpec, dtype=jnp.float32, *, rngs: nnx.Rngs, attention_backend: str = "auto",
                 platform: str | None = None, mesh: Mesh | None = None, expert_mesh: Mesh | None = None,
                 expert_axis: str = "model", quantization: str | None = None,
                 quantization_group_size: int | None = None):
        super().__init__(spec, dtype, rngs=rngs, attention_backend=attention_backend, platform=platform, mesh=mesh,
                         quantization=quantization, quantization_group_size=quantization_group_size)
        self.expert_mesh = expert_mesh
        self.expert_axis = expert_axis

    def _moe_mlp(self, w: dict, x: jax.Array) -> jax.Array:
        """The routed experts over `w`'s expert stacks (their forms: `_mlp`)."""
        spec = self.spec
        weights, ids = route(x, w["router"], spec.num_experts_per_tok, spec.norm_topk_prob,
                             spec.round_router_weights)
        return routed_experts(self.expert_mesh, self.expert_axis, x, weights, ids,
                              tuple(w[name] for name in EXPERT_PARAMS))

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
                mlp = self._mlp(is_moe, {name: params[name][mlp_index] for name in names}, ctx, layer_index)
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

    def _mlp(self, is_moe: bool, w: dict, ctx: LayerContext, layer_index: jax.Array | int) -> Mlp:
        """The layer's FFN over its own params in their forms: the routed experts (their stacks' forms, with the
        experts' adapter slots at the layer's global index), or the dense gated MLP."""
        if not is_moe:
            return partial(gated_mlp, bundle_quantized(w, self.quantization))
        w = bundle_experts(w, EXPERT_PARAMS, self.quantization)
        return partial(self._moe_mlp, bundle_expert_lora(w, EXPERT_PARAMS, ctx.lora, ctx.lora_mask, layer_index))

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

"""The loop over the decoder's layers, in its three forms, recording EAGLE-3's aux hidden states on the way.

- a scan over the params stacked on [num_layers] (the default: compiled once whatever the depth);
- over per-layer arrays (`layers.unstack_layers`, the CPU default, since XLA:CPU copies a stacked layer's weights
  out before each dot) a scan whose matmuls pick their layer's array through a switch (weight_forms/
  layer_switch.py: `LayerSwitch`);
- a Python loop over per-layer arrays (--no-scan-layers).

`scan` and `unrolled` are the two loops: each walks (per-layer input, layer index) pairs, records the chosen
layers' input states (model/aux_hidden.py) and calls a family's step. `run_layers` picks the form for a
`DecoderLayers`-like param dict and readies each layer's weight forms (the switch, quantized linears, LoRA:
model/weight_forms/bundle.py, model/lora_layers.py); the MoE model's per-run scans and Gemma 4's group-indexed
loop call `scan` / `unrolled` directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vllm_jax.model.aux_hidden import AuxHiddenStates
from vllm_jax.model.layers import LayerContext, is_unstacked
from vllm_jax.model.lora_layers import bundle_lora
from vllm_jax.model.quantization import SCALE_SUFFIX, Quantization
from vllm_jax.model.weight_forms.bundle import bundle_quantized, switched_forms

Index = jax.Array | int
Carry = tuple[jax.Array, jax.Array, AuxHiddenStates]  # (hidden [T, H], kv_cache, aux states)
# (what the layer reads, its index, hidden, kv_cache) -> (hidden, kv_cache)
Step = Callable[[Any, Index, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
# DecoderLM._block's signature: (ctx, weights, hidden, kv_cache, layer index, window) -> (hidden, kv_cache)
Block = Callable[[LayerContext, dict, jax.Array, jax.Array, Index, Index], tuple[jax.Array, jax.Array]]


def scan(step: Step, xs: Any, layer_ids: jax.Array, carry: Carry) -> Carry:
    """`step` over the layers as one `jax.lax.scan`: `xs` (any pytree, leading axis the layers) and `layer_ids`
    [n] int32 sliced per iteration; each layer's input state recorded before it runs."""

    def body(carry: Carry, x: tuple[Any, jax.Array]) -> tuple[Carry, None]:
        hidden, kv_cache, aux = carry
        layer_input, layer_index = x
        aux = aux.record(layer_index, hidden)
        hidden, kv_cache = step(layer_input, layer_index, hidden, kv_cache)
        return (hidden, kv_cache, aux), None

    carry, _ = jax.lax.scan(body, carry, (xs, layer_ids))
    return carry


def unrolled(step: Step, layers: Iterable[tuple[Any, int]], carry: Carry) -> Carry:
    """`step` over (per-layer input, layer index) pairs as a Python loop, each layer's input state recorded
    before it runs."""
    hidden, kv_cache, aux = carry
    for layer_input, layer_index in layers:
        aux = aux.record(layer_index, hidden)
        hidden, kv_cache = step(layer_input, layer_index, hidden, kv_cache)
    return hidden, kv_cache, aux


def run_layers(block: Block, ctx: LayerContext, weights: dict, windows: tuple[int, ...],
               quant: Quantization | None, carry: Carry, *, switched: bool) -> Carry:
    """Every layer of `weights` (name -> stacked [L, ...] array, or a tuple of per-layer arrays once unstacked)
    through `block`, each layer's sliding window from `windows`: a scan over stacked params; over per-layer
    arrays the switched scan (`switched`) or the Python loop."""

    def step(layer_input: tuple[dict, Index], layer_index: Index, hidden: jax.Array,
             kv_cache: jax.Array) -> tuple[jax.Array, jax.Array]:
        w, window = layer_input
        w = bundle_lora(bundle_quantized(w, quant), ctx.lora, ctx.lora_mask, layer_index)
        return block(ctx, w, hidden, kv_cache, layer_index, window)

    num_layers = len(windows)
    if is_unstacked(weights) and not switched:
        return unrolled(step, ((({name: value[i] for name, value in weights.items()}, windows[i]), i)
                               for i in range(num_layers)), carry)
    per_layer, stacked = _switched_and_stacked(weights, quant)

    def scan_step(layer_input: tuple[dict, jax.Array], layer_index: jax.Array, hidden: jax.Array,
                  kv_cache: jax.Array) -> tuple[jax.Array, jax.Array]:
        w, window = layer_input
        w = w | switched_forms(per_layer, layer_index, quant)
        return step((w, window), layer_index, hidden, kv_cache)

    xs = (stacked, jnp.asarray(np.array(windows, dtype=np.int32)))
    return scan(scan_step, xs, jnp.arange(num_layers, dtype=jnp.int32), carry)


def _switched_and_stacked(weights: dict, quant: Quantization | None) -> tuple[dict, dict]:
    """(per-layer matrices a switch picks from, what the scan slices): stacked params all go to the scan; of
    per-layer arrays the matrices go through a LayerSwitch and the vectors (norms, biases) restack, as do grouped
    scales [in // g, out] (block fp8: linear weights each layer's partial sums by them)."""
    if not is_unstacked(weights):
        return {}, weights
    grouped = quant is not None and quant.group_size is not None
    per_layer = {name: value for name, value in weights.items()
                 if value[0].ndim == 2 and not (grouped and name.endswith(SCALE_SUFFIX))}
    return per_layer, {name: jnp.stack(value) for name, value in weights.items() if name not in per_layer}

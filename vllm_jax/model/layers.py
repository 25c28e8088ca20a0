"""The building blocks every decoder family here shares: parameter init, RMS norm, rotary embedding (with its
linear and llama3 frequency scalings), linear layers with optional bias, the gated MLP, the attention call
through the resolved backend and the mesh (`AttentionKernels`, over vllm_jax.attention), one pre-norm decoder
block, and the stacked / per-layer param layouts. A linear weight reaches `linear` as a weight form
(model/weight_forms: dense, GGUF blocks, int8 / fp8 with channel or block scales, LoRA-wrapped, switched per
layer), which does its own matmul; a plain array is a dense one.

All functions are pure (arrays in, arrays out) and follow transformers' order of operations and float32
islands, which is what keeps logits within 1e-4 of it. Linear weights are [in, out] (x @ W); the loader
transposes HF's [out, in].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from vllm_jax.attention import AttentionBackend
from vllm_jax.model.fused_projections import QKV, FusedLayout, qkv_layout
from vllm_jax.model.grouped_quant import grouped_shapes, min_name
from vllm_jax.model.quantization import Quantization, quantize, scale_name
from vllm_jax.model.spec import DecoderSpec
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.model.weight_forms.base import WeightForm, joined_matmuls
from vllm_jax.model.weight_forms.dense import as_weight_form
from vllm_jax.model.weight_forms.lora import NO_ADAPTER, LoRAMask

Mlp = Callable[[jax.Array], jax.Array]


# ---- parameters -------------------------------------------------------------------------------------------

def init_param(rngs: nnx.Rngs, shape: tuple[int, ...], dtype, scale: float = 0.02) -> nnx.Param:
    """A normal(0, scale) weight: random weights for tests and research, overwritten when a checkpoint loads."""
    return nnx.Param((jax.random.normal(rngs.params(), shape, jnp.float32) * scale).astype(dtype))


def linear_params(rngs: nnx.Rngs, name: str, shape: tuple[int, ...], dtype,
                  quant: Quantization | None) -> dict[str, nnx.Param]:
    """A linear weight [..., in, out] under `name`: a normal(0, 0.02) one, or with `quant` its quantized values
    plus `{name}_scale` [..., out] float32 (model/quantization.py); with grouped scales [..., in // g, out] (the
    channel's scale repeated: the same weight). Kept GGUF blocks (`quant.gguf_kept`) are values, `_scale` and
    `_min` grouped along the input dim (model/grouped_quant.py), or a float param when the file does not keep
    `name`."""
    if quant is not None and quant.gguf_kept:
        fmt = quant.format_of(name)
        return grouped_params(name, shape, fmt, axis=-2) if fmt else {name: init_param(rngs, shape, dtype)}
    param = init_param(rngs, shape, dtype)
    if quant is None:
        return {name: param}
    values, scale = quantize(param.get_value(), quant.scheme)
    groups = quant.scale_groups(name, shape[-2])
    if groups is not None:
        scale = jnp.broadcast_to(scale[..., None, :], (*scale.shape[:-1], groups, scale.shape[-1]))
    return {name: nnx.Param(values), scale_name(name): nnx.Param(scale)}


def fused_or_separate(rngs: nnx.Rngs, layout: FusedLayout | None, shapes: dict[str, tuple[int, ...]], dtype,
                      quant: Quantization | None) -> dict[str, nnx.Param]:
    """The linears `shapes` (name -> [..., in, out], in order) as separate params, or with `layout` as its one
    fused param. The fused one is drawn part by part and joined, so seeded random weights are the same numbers in
    either layout."""
    if layout is None:
        return {key: param for name, shape in shapes.items()
                for key, param in linear_params(rngs, name, shape, dtype, quant).items()}
    parts = [init_param(rngs, shapes[name], dtype).get_value() for name in layout.parts]
    return {layout.name: nnx.Param(layout.join(parts))}


def grouped_params(name: str, shape: tuple[int, ...], fmt: str, axis: int) -> dict[str, nnx.Param]:
    """Zero placeholders of a weight kept in GGUF blocks (`fmt`, groups along `axis`): the loader fills them."""
    suffixes = {"values": name, "scale": scale_name(name), "min": min_name(name)}
    return {suffixes[part]: nnx.Param(jnp.zeros(part_shape, part_dtype))
            for part, (part_shape, part_dtype) in grouped_shapes(shape, fmt, axis).items()}


def attention_params(spec: DecoderSpec, dtype, rngs: nnx.Rngs, quant: Quantization | None = None,
                     fused: bool = False) -> dict[str, nnx.Param]:
    """The attention half of every layer (norms, q/k/v/o, their biases, q/k norms), stacked on axis 0; q/k/v/o
    quantized with `quant`; q/k/v one `qkv_proj` with `fused` (model/fused_projections.py)."""
    n, h = spec.num_layers, spec.hidden_size
    shapes = {"q_proj": (n, h, spec.q_size), "k_proj": (n, h, spec.kv_size), "v_proj": (n, h, spec.kv_size)}
    params = {
        "input_norm": nnx.Param(jnp.ones((n, h), dtype)),
        "post_attention_norm": nnx.Param(jnp.ones((n, h), dtype)),
        **fused_or_separate(rngs, qkv_layout(spec) if fused else None, shapes, dtype, quant),
        **linear_params(rngs, "o_proj", (n, spec.q_size, h), dtype, quant),
    }
    if spec.qkv_bias:
        params["q_bias"] = nnx.Param(jnp.zeros((n, spec.q_size), dtype))
        params["k_bias"] = nnx.Param(jnp.zeros((n, spec.kv_size), dtype))
        params["v_bias"] = nnx.Param(jnp.zeros((n, spec.kv_size), dtype))
    if spec.o_bias:
        params["o_bias"] = nnx.Param(jnp.zeros((n, h), dtype))
    if spec.qk_norm:
        params["q_norm"] = nnx.Param(jnp.ones((n, spec.head_dim), dtype))
        params["k_norm"] = nnx.Param(jnp.ones((n, spec.head_dim), dtype))
    return params


# ---- norms, rotary, linear, MLP ---------------------------------------------------------------------------

def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """HF's RMSNorm: normalize in float32, cast back, then scale."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight * xf.astype(x.dtype)


def zero_centred_rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """The RMSNorm whose weight starts at zero (Gemma, Qwen3.5): normalize and scale by (1 + weight) in float32,
    then cast back (transformers multiplies before the cast, unlike Llama's)."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)


def rotary_tables(spec: DecoderSpec, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos and sin [T, head_dim] for each token's position, computed once per step for every layer."""
    inv_freq = jnp.asarray(np.array(spec.inv_freq, dtype=np.float32))
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * spec.rope_attention_scaling, jnp.sin(emb) * spec.rope_attention_scaling


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """HF's rotate_half convention (non-interleaved halves), computed in float32."""
    xf = x.astype(jnp.float32)
    half = xf.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos[:, None, :] + rotated * sin[:, None, :]).astype(x.dtype)


def linear(x: jax.Array, weight: WeightForm | jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """x @ weight (+ bias), accumulated in float32 (int32 for W8A8), returned in x's dtype: the weight form's own
    `linear` (model/weight_forms; a plain array is a dense weight). A quantized form scales its output per channel
    (and per row for W8A8) before the bias; a LoRA-wrapped one adds its adapters' delta to the base output."""
    return as_weight_form(weight).linear(x, bias)


def matmul_f32(x: jax.Array, weight: WeightForm | jax.Array) -> jax.Array:
    """float32 x @ weight: `linear` without its bias and final cast (an untied quantized LM head's logits too)."""
    return as_weight_form(weight).matmul(x)


def linears(x: jax.Array, weights: list, biases: list) -> list[jax.Array]:
    """[linear(x, w, b) for each weight and bias]: q / k / v or gate / up as one call where their forms join
    (`WeightForm.join_key`: plain weights in one `float_dots`, kept GGUF blocks in one `gguf_dots`, on CPU one
    native call, and in the CPU scan one switch over the layers instead of one per weight)."""
    forms = [as_weight_form(w) for w in weights]
    outs = joined_matmuls(x, forms)
    if outs is None:
        return [form.linear(x, b) for form, b in zip(forms, biases)]
    return [(y if b is None else y + b.astype(jnp.float32)).astype(x.dtype) for y, b in zip(outs, biases)]


def fused_linears(x: jax.Array, w: dict, layout: FusedLayout, biases: list) -> list[jax.Array]:
    """`linears` of the layout's parts through its one fused weight `w[layout.name]`: each part's output as the
    separate linear gives it (the biases, joined, added in float32 before the cast to the model dtype; split
    after the cast, so an accelerator slices the model-dtype product), plus the part's LoRA delta when
    `bundle_lora` put its adapter (a LoRAAdapter) under the part's name (else NO_ADAPTER adds nothing)."""
    y = matmul_f32(x, w[layout.name])
    if any(b is not None for b in biases):
        y = y + layout.join([jnp.zeros((layout.part_size(p),), jnp.float32) if b is None else b.astype(jnp.float32)
                             for p, b in enumerate(biases)])
    parts = layout.split(y.astype(x.dtype))
    return [w.get(name, NO_ADAPTER).added_to(x, out) for name, out in zip(layout.parts, parts)]


def gated_mlp(w: dict, x: jax.Array) -> jax.Array:
    """SiLU-gated MLP: down(silu(gate(x)) * up(x)), from one layer's `gate/up/down_proj` (and biases)."""
    gate, up = linears(x, [w["gate_proj"], w["up_proj"]], [w.get("gate_bias"), w.get("up_bias")])
    return linear(jax.nn.silu(gate) * up, w["down_proj"], w.get("down_bias"))


# ---- attention and the decoder block ----------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionKernels:
    """The attention a model's program calls, fixed when the model is built (static: part of the graphdef): the
    resolved backend (vllm_jax.attention: its kernels, KV layout and shard_map wrapping, for the platform the
    program is built for, so a CPU host building a TPU program emits the Mosaic kernel, not interpret mode) and,
    under tensor parallelism, the mesh it runs over (docs/architecture/09-sharding.md, "Sharding"). `k_scale` /
    `v_scale`: the KV cache's per-tensor scales (it holds K / k_scale, V / v_scale: pallas_kernels/kv_quant.py), 1.0 as
    in vLLM."""

    backend: AttentionBackend
    mesh: Mesh | None = None
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def platform(self) -> str:
        return self.backend.platform

    def write_kv_cache(self, kv_cache: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array,
                       layer_index: jax.Array | int) -> jax.Array:
        return self.backend.write_kv_cache(kv_cache, k, v, slot_mapping, layer_index=layer_index,
                                           k_scale=self.k_scale, v_scale=self.v_scale, mesh=self.mesh)

    def attention(self, q: jax.Array, kv_cache: jax.Array, inputs: StepInputs, *, sm_scale: float,
                  window: jax.Array | int, layer_index: jax.Array | int,
                  soft_cap: float | None = None, sinks: jax.Array | None = None) -> jax.Array:
        """`soft_cap` (Gemma 2) and `sinks` (gpt-oss) as AttentionBackend.attention takes them."""
        return self.backend.attention(q, kv_cache, inputs.block_tables, inputs.seq_lens, inputs.query_start_loc,
                                      inputs.num_seqs, sm_scale=sm_scale, sliding_window=window, soft_cap=soft_cap,
                                      layer_index=layer_index, k_scale=self.k_scale, v_scale=self.v_scale,
                                      sinks=sinks, mesh=self.mesh)

    def mla_attention(self, q_latent: jax.Array, q_rope: jax.Array, kv_cache: jax.Array, inputs: StepInputs, *,
                      sm_scale: float, layer_index: jax.Array | int) -> jax.Array:
        """DeepSeek's MLA over the latent cache (AttentionBackend.mla_attention): the backend's own kernel; under
        a mesh the Pallas kernels run per device on its heads over the replicated cache."""
        return self.backend.mla_attention(q_latent, q_rope, kv_cache, inputs.block_tables, inputs.seq_lens,
                                          inputs.query_start_loc, inputs.num_seqs, sm_scale=sm_scale,
                                          layer_index=layer_index, mesh=self.mesh)


@dataclass(frozen=True)
class LayerContext:
    """What every layer of one step reads besides its weights: the rotary tables, the step's batch and the
    attention kernels; with LoRA, the stacked adapter slots (target -> (a [L, N, in, R], b [L, N, R, out])) and
    each token's slot (LoRAMask)."""

    cos: jax.Array
    sin: jax.Array
    inputs: StepInputs
    kernels: AttentionKernels
    lora: dict | None = None
    lora_mask: LoRAMask | None = None


def attention(spec: DecoderSpec, ctx: LayerContext, w: dict, x: jax.Array, kv_cache: jax.Array,
              layer_index: jax.Array | int, window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """Self-attention of the normed hidden states `x` [T, hidden] over the paged KV cache: q/k/v (q/k norms,
    rotary), this step's K/V written through `slot_mapping` before the ragged paged attention reads the pages,
    then o_proj. -> (attention output [T, hidden], updated kv_cache)."""
    q, k, v = project_qkv(spec, w, x)
    if spec.qk_norm:
        q = rms_norm(q, w["q_norm"], spec.rms_norm_eps)
        k = rms_norm(k, w["k_norm"], spec.rms_norm_eps)
    return attend(spec, ctx, w, q, k, v, kv_cache, layer_index, window)


def qkv_outputs(spec: DecoderSpec, w: dict, x: jax.Array) -> list[jax.Array]:
    """q [T, q_size], k and v [T, kv_size] from x [T, hidden] (with their biases), through separate or fused
    weights."""
    biases = [w.get("q_bias"), w.get("k_bias"), w.get("v_bias")]
    if QKV in w:
        return fused_linears(x, w, qkv_layout(spec), biases)
    return linears(x, [w["q_proj"], w["k_proj"], w["v_proj"]], biases)


def project_qkv(spec: DecoderSpec, w: dict, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q [T, heads, head_dim], k and v [T, kv_heads, head_dim] from x [T, hidden] (with their biases)."""
    t = x.shape[0]
    q, k, v = qkv_outputs(spec, w, x)
    return (q.reshape(t, spec.num_heads, spec.head_dim), k.reshape(t, spec.num_kv_heads, spec.head_dim),
            v.reshape(t, spec.num_kv_heads, spec.head_dim))


def attend(spec: DecoderSpec, ctx: LayerContext, w: dict, q: jax.Array, k: jax.Array, v: jax.Array,
           kv_cache: jax.Array, layer_index: jax.Array | int,
           window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """`attention` after the projections (q [T, heads, head_dim], k / v [T, kv_heads, head_dim]): rotary, the KV
    write, the paged attention and o_proj; families that project differently (models/olmo2/model.py) call it too."""
    t, inputs = q.shape[0], ctx.inputs
    q, k = apply_rotary(q, ctx.cos, ctx.sin), apply_rotary(k, ctx.cos, ctx.sin)
    kv_cache = ctx.kernels.write_kv_cache(kv_cache, k, v, inputs.slot_mapping, layer_index)
    attn = ctx.kernels.attention(q, kv_cache, inputs, sm_scale=spec.sm_scale, window=window,
                                 layer_index=layer_index, sinks=w.get("sinks"))  # gpt-oss's attention sinks
    return linear(attn.reshape(t, spec.q_size), w["o_proj"], w.get("o_bias")), kv_cache


def decoder_block(spec: DecoderSpec, ctx: LayerContext, w: dict, mlp: Mlp, hidden: jax.Array,
                  kv_cache: jax.Array, layer_index: jax.Array | int,
                  window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """One pre-norm layer: attention, then `mlp` on the post-attention-normed hidden state, each with its
    residual. -> (hidden, updated kv_cache)."""
    x = rms_norm(hidden, w["input_norm"], spec.rms_norm_eps)
    attn, kv_cache = attention(spec, ctx, w, x, kv_cache, layer_index, window)
    hidden = hidden + attn
    hidden = hidden + mlp(rms_norm(hidden, w["post_attention_norm"], spec.rms_norm_eps))
    return hidden, kv_cache


# ---- stacked and per-layer param layouts ------------------------------------------------------------------

def layer_param_values(layers: nnx.Module) -> dict:
    """name -> stacked array (or tuple of per-layer arrays once unstacked) for every param of `layers`."""
    return {name: p.get_value() for name, p in vars(layers).items() if isinstance(p, nnx.Param)}


def is_unstacked(layer_weights: dict) -> bool:
    return any(isinstance(value, tuple) for value in layer_weights.values())


def unstack_layers(state: nnx.State) -> None:
    """Replace each stacked layer param [L, ...] in `state` by a tuple of L separate arrays, in place.

    XLA on CPU copies a layer's weights out of the stack at every iteration of a scan (its dot cannot read a
    slice in place); separate arrays let an unrolled loop (--no-scan-layers) or a scan's switched matmuls
    (weight_forms/layer_switch.py: `LayerSwitch`, the CPU default) read them directly."""
    for variable in state["layers"].values():
        value = variable.get_value()
        variable.set_value(tuple(value[i] for i in range(value.shape[0])))

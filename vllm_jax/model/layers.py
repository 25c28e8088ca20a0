"""The building blocks every decoder family here shares: parameter init, RMS norm, rotary embedding (with its
linear and llama3 frequency scalings), linear layers with optional bias, the gated MLP, the attention call
through the resolved backend and the mesh (`AttentionKernels`, over vllm_jax.attention), one pre-norm decoder
block, and the stacked / per-layer param layouts. A quantized weight (model/quantization.py) reaches `linear` as a
`QuantizedWeight`, which dequantizes inside the dot (model/quantized_dots.py); LoRA adapters as a `LoRAWeight`
(model/lora_layers.py).

All functions are pure (arrays in, arrays out) and follow transformers' order of operations and float32
islands, which is what keeps logits within 1e-4 of it. Linear weights are [in, out] (x @ W); the loader
transposes HF's [out, in].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from vllm_jax.attention import AttentionBackend
from vllm_jax.model.fused_projections import QKV, FusedLayout, qkv_layout
from vllm_jax.model.grouped_quant import grouped_shapes, min_name
from vllm_jax.model.lora_layers import LoRAMask, LoRAWeight
from vllm_jax.model.quantization import QUANTIZED_LINEARS, Quantization, quantize, quantize_rows, scale_name
from vllm_jax.model.quantized_dots import float_dots, gguf_dot, gguf_dots, grouped_dot
from vllm_jax.model.rope_longrope import longrope_inv_freq
from vllm_jax.model.rope_yarn import yarn_inv_freq
from vllm_jax.model.step_inputs import StepInputs

if TYPE_CHECKING:  # spec.py reads rope scaling through rope_inv_freq below
    from vllm_jax.model.spec import DecoderSpec

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


def rope_inv_freq(rope: dict, head_dim: int) -> tuple[np.ndarray, float]:
    """(inverse frequencies, cos/sin multiplier) as transformers computes them (float32) for HF-style rope
    parameters (`rope_theta`, `rope_type` and that type's keys)."""
    dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    base = float(rope["rope_theta"])
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    rope_type = rope["rope_type"]
    if rope_type == "default":
        return inv_freq.astype(np.float32), 1.0
    if rope_type == "linear":
        return (inv_freq / float(rope["factor"])).astype(np.float32), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope).astype(np.float32), 1.0
    if rope_type == "longrope":  # the short factors; spec.long_inv_freq holds the long (model/rope_longrope.py)
        return longrope_inv_freq(rope, head_dim)
    if rope_type == "yarn":
        return yarn_inv_freq(rope, head_dim)
    raise ValueError(f"rope_type {rope_type!r} is not supported yet (supported: default, linear, llama3, longrope, "
                     "yarn)")


def _llama3_inv_freq(inv_freq: np.ndarray, rope: dict) -> np.ndarray:
    """Llama 3.1 frequency-dependent scaling: long wavelengths divided by `factor`, short kept, smooth between."""
    factor = float(rope["factor"])
    low_freq_factor = float(rope["low_freq_factor"])
    high_freq_factor = float(rope["high_freq_factor"])
    old_context = float(rope["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(medium, smoothed, scaled)


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


@dataclass(frozen=True)
class LayerSwitch:
    """One layer's matrix inside a scan over per-layer arrays: `x @ W[layer]` runs as a switch over the layers.

    XLA:CPU copies a dynamic slice of a stacked weight out before every dot (its dot reads whole buffers); a
    switch branch reads its operand in place, and the layer body is still compiled once."""

    arrays: tuple  # one array per layer; kept GGUF blocks: one (values, scale, min) tuple per layer
    index: jax.Array
    fmt: str | None = None  # kept GGUF format of `arrays` (model/grouped_quant.py), static

    def matmul(self, x: jax.Array) -> jax.Array:
        return self.apply(_float_dot if self.fmt is None else partial(_gguf_dot_parts, fmt=self.fmt), x)

    def apply(self, fn: Callable[[jax.Array, Any], jax.Array], x: jax.Array) -> jax.Array:
        """fn(x, W[layer]) as a switch over the layers."""
        branches = [partial(_apply_nth, fn, n) for n in range(len(self.arrays))]
        return jax.lax.switch(self.index, branches, x, self.arrays)


def _apply_nth(fn: Callable[[jax.Array, Any], jax.Array], n: int, x: jax.Array, arrays: tuple) -> jax.Array:
    return fn(x, arrays[n])


def _gguf_dot_parts(x: jax.Array, parts: tuple, fmt: str) -> jax.Array:
    return gguf_dot(x, *parts, fmt)


def _float_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    """`dot`, on CPU for float32 weights at a few rows by the native kernel (quantized_dots.float_dots)."""
    return float_dots(x, [w])[0]


def _matmul(x: jax.Array, weight: jax.Array | LayerSwitch) -> jax.Array:
    return weight.matmul(x) if isinstance(weight, LayerSwitch) else _float_dot(x, weight)


@dataclass(frozen=True)
class QuantizedWeight:
    """A quantized linear weight inside the forward: values [in, out] (int8 / float8_e4m3fn; or a LayerSwitch over
    per-layer values), float32 scales [out] (per channel) or [in // g, out] (grouped, weight-only), and whether the
    activations are quantized too (W8A8). Kept GGUF blocks (`fmt` set): values, float16 scales and mins
    [in // 32, out] (model/grouped_quant.py)."""

    values: jax.Array | LayerSwitch
    scale: jax.Array
    quantize_activations: bool
    minimum: jax.Array | None = None
    fmt: str | None = None


def bundle_quantized(w: dict, quant: Quantization | None) -> dict:
    """One layer's weights with each quantized linear and its `_scale` (and `_min`) siblings joined into a
    QuantizedWeight, or for kept GGUF blocks switched per layer into one LayerSwitch (the dict unchanged without
    `quant`)."""
    if quant is None:
        return w
    out = dict(w)
    for name in QUANTIZED_LINEARS:
        if scale_name(name) not in out:
            continue
        values, scale, minimum = out[name], out.pop(scale_name(name)), out.pop(min_name(name), None)
        fmt = quant.format_of(name) if quant.gguf_kept else None
        if isinstance(values, LayerSwitch) and fmt is not None:
            parts = [values.arrays, scale.arrays] + ([minimum.arrays] if minimum is not None else [])
            arrays = tuple(layer + ((None,) if minimum is None else ()) for layer in zip(*parts))
            out[name] = LayerSwitch(arrays, values.index, fmt)
        else:
            out[name] = QuantizedWeight(values, scale, quant.quantize_activations, minimum, fmt)
    return out


def linear(x: jax.Array, weight: jax.Array | LayerSwitch | QuantizedWeight | LoRAWeight,
           bias: jax.Array | None = None) -> jax.Array:
    """x @ weight (+ bias), accumulated in float32 (int32 for W8A8), returned in x's dtype. A QuantizedWeight is
    dequantized here: its output is scaled per channel (and per row for W8A8) before the bias. A LoRAWeight adds
    its adapters' delta to the base output."""
    if isinstance(weight, LoRAWeight):
        y = linear(x, weight.base, bias).astype(jnp.float32) + weight.delta(x)
        return y.astype(x.dtype)
    y = matmul_f32(x, weight)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def matmul_f32(x: jax.Array, weight: jax.Array | LayerSwitch | QuantizedWeight) -> jax.Array:
    """float32 x @ weight: `linear` without its bias and final cast (an untied quantized LM head's logits too)."""
    if isinstance(weight, QuantizedWeight) and weight.fmt is not None:
        y = gguf_dot(x, weight.values, weight.scale, weight.minimum, weight.fmt)
    elif isinstance(weight, QuantizedWeight):
        if weight.scale.ndim == 2:  # grouped scales [in // g, out]: weight each group's partial sums, then add
            groups = weight.scale.shape[0]
            by_group = partial(grouped_dot, groups=groups)
            parts = (weight.values.apply(by_group, x) if isinstance(weight.values, LayerSwitch)
                     else by_group(x, weight.values))
            y = jnp.sum(parts * weight.scale, axis=-2)
        elif weight.quantize_activations:
            xq, row_scale = quantize_rows(x)
            y = _matmul(xq, weight.values).astype(jnp.float32) * row_scale * weight.scale
        else:
            y = _matmul(x, weight.values) * weight.scale
    else:
        y = _matmul(x, weight)
    return y.astype(jnp.float32)


def linears(x: jax.Array, weights: list, biases: list) -> list[jax.Array]:
    """[linear(x, w, b) for each weight and bias]: q / k / v or gate / up as one call of `gguf_dots` (kept GGUF
    blocks) or `float_dots` (plain weights), on CPU one native call, and in the CPU scan one switch over the layers
    instead of one per weight."""
    outs = _joined_dots(x, weights)
    if outs is None:
        return [linear(x, w, b) for w, b in zip(weights, biases)]
    return [(y if b is None else y + b.astype(jnp.float32)).astype(x.dtype) for y, b in zip(outs, biases)]


def _joined_dots(x: jax.Array, weights: list) -> list[jax.Array] | None:
    """float32 x @ W of each weight when all are kept GGUF blocks of one layout or all plain arrays, else None."""
    if all(isinstance(w, LayerSwitch) and w.index is weights[0].index for w in weights):
        fmts = [w.fmt for w in weights]
        per_layer = tuple(zip(*(w.arrays for w in weights)))  # layer -> each weight's array (kept: its parts)
        if all(fmt is None for fmt in fmts):
            return LayerSwitch(per_layer, weights[0].index).apply(float_dots, x)
        if any(fmt is None for fmt in fmts):
            return None

        def layer_dots(x: jax.Array, parts: tuple) -> list[jax.Array]:
            return gguf_dots(x, [(*p, fmt) for p, fmt in zip(parts, fmts)])

        return LayerSwitch(per_layer, weights[0].index).apply(layer_dots, x)
    if all(isinstance(w, QuantizedWeight) and w.fmt is not None and not isinstance(w.values, LayerSwitch)
           for w in weights):
        return gguf_dots(x, [(w.values, w.scale, w.minimum, w.fmt) for w in weights])
    if all(isinstance(w, jax.Array) for w in weights):
        return float_dots(x, weights)
    return None


def fused_linears(x: jax.Array, w: dict, layout: FusedLayout, biases: list) -> list[jax.Array]:
    """`linears` of the layout's parts through its one fused weight `w[layout.name]`: each part's output as the
    separate linear gives it (the biases, joined, added in float32 before the cast to the model dtype; split
    after the cast, so an accelerator slices the model-dtype product), plus the part's LoRA delta when
    `bundle_lora` put one under the part's name."""
    y = matmul_f32(x, w[layout.name])
    if any(b is not None for b in biases):
        y = y + layout.join([jnp.zeros((layout.part_size(p),), jnp.float32) if b is None else b.astype(jnp.float32)
                             for p, b in enumerate(biases)])
    outs = []
    for part, out in zip(layout.parts, layout.split(y.astype(x.dtype))):
        adapter = w.get(part)
        if isinstance(adapter, LoRAWeight):
            out = (out.astype(jnp.float32) + adapter.delta(x)).astype(x.dtype)
        outs.append(out)
    return outs


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
    (`LayerSwitch`, the CPU default) read them directly."""
    for variable in state["layers"].values():
        value = variable.get_value()
        variable.set_value(tuple(value[i] for i in range(value.shape[0])))

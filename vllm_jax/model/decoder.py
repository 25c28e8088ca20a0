"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) as a Flax NNX module over stacked layer params.

Layer weights are stacked on a leading [num_layers] axis and the forward scans over them, so compile time
does not grow with depth. The forward is pure in (params, kv_cache, StepInputs): the runner splits the module
once (`nnx.split`) and jits `forward(graphdef, state, kv_cache, inputs)`. The KV cache is the scan's carry and
is written through `slot_mapping` at each layer before that layer's attention reads it; nothing returns a
per-layer copy of it. Only the `logits_indices` rows reach the LM head.

Linear weights are stored [in, out] (x @ W); the loader transposes HF's [out, in].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vllm_jax.model.spec import DecoderSpec
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.pallas_kernels import ragged_paged_attention, write_kv_cache


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], dtype, scale: float = 0.02) -> nnx.Param:
    return nnx.Param((jax.random.normal(rngs.params(), shape, jnp.float32) * scale).astype(dtype))


def attention_params(spec: DecoderSpec, dtype, rngs: nnx.Rngs) -> dict[str, nnx.Param]:
    """The attention half of every layer (norms, q/k/v/o, their biases, q/k norms), stacked on axis 0; shared
    by the dense decoder and the MoE model."""
    n, h = spec.num_layers, spec.hidden_size
    params = {
        "input_norm": nnx.Param(jnp.ones((n, h), dtype)),
        "post_attention_norm": nnx.Param(jnp.ones((n, h), dtype)),
        "q_proj": _param(rngs, (n, h, spec.q_size), dtype),
        "k_proj": _param(rngs, (n, h, spec.kv_size), dtype),
        "v_proj": _param(rngs, (n, h, spec.kv_size), dtype),
        "o_proj": _param(rngs, (n, spec.q_size, h), dtype),
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


class DecoderLayers(nnx.Module):
    """All decoder layers' weights, stacked on axis 0."""

    def __init__(self, spec: DecoderSpec, dtype, rngs: nnx.Rngs):
        n, h, i = spec.num_layers, spec.hidden_size, spec.intermediate_size
        for name, param in attention_params(spec, dtype, rngs).items():
            setattr(self, name, param)
        self.gate_proj = _param(rngs, (n, h, i), dtype)
        self.up_proj = _param(rngs, (n, h, i), dtype)
        self.down_proj = _param(rngs, (n, i, h), dtype)
        if spec.mlp_bias:
            self.gate_bias = nnx.Param(jnp.zeros((n, i), dtype))
            self.up_bias = nnx.Param(jnp.zeros((n, i), dtype))
            self.down_bias = nnx.Param(jnp.zeros((n, h), dtype))


class DecoderLM(nnx.Module):
    # With per-layer arrays (unstack_layers): scan with switched matmuls (True) or a Python loop (False).
    # The runner sets it before splitting the module; it is static (part of the graphdef).
    scan_layers: bool = True
    switched_scan: bool = True  # whether _run_layers can scan over per-layer arrays (the MoE model cannot)

    def __init__(self, spec: DecoderSpec, dtype=jnp.float32, *, rngs: nnx.Rngs, attention_backend: str = "auto"):
        self.spec = spec
        self.attention_backend = attention_backend
        self.embed_tokens = _param(rngs, (spec.vocab_size, spec.hidden_size), dtype)
        self.layers = DecoderLayers(spec, dtype, rngs)
        self.final_norm = nnx.Param(jnp.ones((spec.hidden_size,), dtype))
        if not spec.tie_word_embeddings:
            self.lm_head = _param(rngs, (spec.hidden_size, spec.vocab_size), dtype)

    def __call__(self, kv_cache: jax.Array, inputs: StepInputs) -> tuple[jax.Array, jax.Array]:
        """-> (updated kv_cache, float32 logits [S, vocab]) for the last scheduled token of each row."""
        spec = self.spec
        hidden = self.embed_tokens[...][inputs.input_ids]
        cos, sin = _rotary_tables(spec, inputs.positions)
        hidden, kv_cache = self._run_layers(hidden, kv_cache, cos, sin, inputs)
        last = _rms_norm(hidden[inputs.logits_indices], self.final_norm[...], spec.rms_norm_eps)
        head = self.embed_tokens[...].T if spec.tie_word_embeddings else self.lm_head[...]
        logits = jnp.dot(last, head, preferred_element_type=jnp.float32)
        return kv_cache, logits

    def _run_layers(self, hidden: jax.Array, kv_cache: jax.Array, cos: jax.Array, sin: jax.Array,
                    inputs: StepInputs) -> tuple[jax.Array, jax.Array]:
        """All layers: a scan over the stacked params; over per-layer arrays (`unstack_layers`), a scan whose
        matmuls pick their layer's array through a switch (`scan_layers`, the CPU form) or a Python loop;
        subclasses with other MLPs override this."""
        spec = self.spec
        layer_weights = layer_param_values(self.layers)
        if is_unstacked(layer_weights) and not self.scan_layers:
            for i in range(spec.num_layers):
                w = {name: value[i] for name, value in layer_weights.items()}
                hidden, kv_cache = _decoder_layer(spec, self.attention_backend, w, hidden, kv_cache, i,
                                                  spec.sliding_windows[i], cos, sin, inputs)
            return hidden, kv_cache
        windows = jnp.asarray(np.array(spec.sliding_windows, dtype=np.int32))
        per_layer, stacked = {}, layer_weights
        if is_unstacked(layer_weights):
            per_layer = {name: value for name, value in layer_weights.items() if value[0].ndim == 2}
            stacked = {name: jnp.stack(value) for name, value in layer_weights.items() if name not in per_layer}

        def layer(carry, xs):
            hidden, kv_cache = carry
            w, layer_index, window = xs
            w = w | {name: LayerSwitch(arrays, layer_index) for name, arrays in per_layer.items()}
            hidden, kv_cache = _decoder_layer(spec, self.attention_backend, w, hidden, kv_cache, layer_index,
                                              window, cos, sin, inputs)
            return (hidden, kv_cache), None

        (hidden, kv_cache), _ = jax.lax.scan(
            layer, (hidden, kv_cache), (stacked, jnp.arange(spec.num_layers, dtype=jnp.int32), windows))
        return hidden, kv_cache


@dataclass(frozen=True)
class LayerSwitch:
    """One layer's matrix inside a scan over per-layer arrays: `x @ W[layer]` runs as a switch over the layers.

    XLA:CPU copies a dynamic slice of a stacked weight out before every dot (its dot reads whole buffers), which
    made a batch-1 decode step ~1.7x slower than an unrolled loop; a switch branch reads its operand in place, and
    the layer body is still compiled once."""

    arrays: tuple[jax.Array, ...]
    index: jax.Array

    def matmul(self, x: jax.Array) -> jax.Array:
        branches = [partial(_dot_nth, n) for n in range(len(self.arrays))]
        return jax.lax.switch(self.index, branches, x, self.arrays)


def _dot_nth(n: int, x: jax.Array, arrays: tuple[jax.Array, ...]) -> jax.Array:
    return jnp.dot(x, arrays[n], preferred_element_type=jnp.float32)


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
    for name, variable in state["layers"].items():
        value = variable.get_value()
        variable.set_value(tuple(value[i] for i in range(value.shape[0])))


def _decoder_layer(spec: DecoderSpec, backend: str, w: dict, hidden: jax.Array, kv_cache: jax.Array,
                   layer_index: jax.Array, window: jax.Array, cos: jax.Array, sin: jax.Array,
                   inputs: StepInputs, mlp: Callable[[jax.Array], jax.Array] | None = None,
                   ) -> tuple[jax.Array, jax.Array]:
    """One layer: attention (reads/writes the KV cache), then `mlp` on the post-attention-normed hidden state
    (default: the dense gated MLP from `w`), each with its residual."""
    t = hidden.shape[0]
    x = _rms_norm(hidden, w["input_norm"], spec.rms_norm_eps)
    q = _linear(x, w["q_proj"], w.get("q_bias")).reshape(t, spec.num_heads, spec.head_dim)
    k = _linear(x, w["k_proj"], w.get("k_bias")).reshape(t, spec.num_kv_heads, spec.head_dim)
    v = _linear(x, w["v_proj"], w.get("v_bias")).reshape(t, spec.num_kv_heads, spec.head_dim)
    if spec.qk_norm:
        q = _rms_norm(q, w["q_norm"], spec.rms_norm_eps)
        k = _rms_norm(k, w["k_norm"], spec.rms_norm_eps)
    q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
    kv_cache = write_kv_cache(kv_cache, k, v, inputs.slot_mapping, layer_index=layer_index, backend=backend)
    attn = ragged_paged_attention(
        q, kv_cache, inputs.block_tables, inputs.seq_lens, inputs.query_start_loc, inputs.num_seqs,
        sm_scale=spec.head_dim ** -0.5, sliding_window=window, backend=backend, layer_index=layer_index)
    hidden = hidden + _linear(attn.reshape(t, spec.q_size), w["o_proj"], w.get("o_bias"))
    x = _rms_norm(hidden, w["post_attention_norm"], spec.rms_norm_eps)
    hidden = hidden + (_dense_mlp(w, x) if mlp is None else mlp(x))
    return hidden, kv_cache


def _dense_mlp(w: dict, x: jax.Array) -> jax.Array:
    """SiLU-gated MLP: down(silu(gate(x)) * up(x))."""
    gate = _linear(x, w["gate_proj"], w.get("gate_bias"))
    up = _linear(x, w["up_proj"], w.get("up_bias"))
    return _linear(jax.nn.silu(gate) * up, w["down_proj"], w.get("down_bias"))


def _linear(x: jax.Array, weight: jax.Array | LayerSwitch, bias: jax.Array | None) -> jax.Array:
    if isinstance(weight, LayerSwitch):
        y = weight.matmul(x)
    else:
        y = jnp.dot(x, weight, preferred_element_type=jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def _rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """HF's RMSNorm: normalize in float32, cast back, then scale."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight * xf.astype(x.dtype)


def _rotary_tables(spec: DecoderSpec, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    inv_freq = jnp.asarray(np.array(spec.inv_freq, dtype=np.float32))
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * spec.rope_attention_scaling, jnp.sin(emb) * spec.rope_attention_scaling


def _apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """HF's rotate_half convention (non-interleaved halves), computed in float32."""
    xf = x.astype(jnp.float32)
    half = xf.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos[:, None, :] + rotated * sin[:, None, :]).astype(x.dtype)

"""The Gemma 4 text decoder (docs/architecture/12-families.md, "Gemma 4"; what differs from Gemma 3:
models/gemma4/spec.py).

Layers differ in shape (sliding layers' head_dim vs the full layers' global_head_dim, KV-shared layers without
k/v projections and with a double-wide MLP), so the params are stacked per group of same-shaped layers
(`Gemma4Spec.group_of`: sliding, full, sliding_shared, full_shared; param `layers/{group}_{name}`) and the forward
is a Python loop over the layers, each reading its group's slice. The KV cache is the one array every model
has, [cache layers, blocks, block_size, 2 * KV heads, width] with the most KV heads and the widest head_dim of the
producing layers: a layer repeats its KV heads and zero-pads its K/V (and q) to that, writes and attends through
any backend (the Pallas kernels take head_dim from q, i.e. the cache width; pallas_tpu's lane-dense cache holds
each repeated head's padded K | V pair), and a KV-shared layer attends its producer's cache layer without writing.
PLE params (`embed_tokens_per_layer`, `per_layer_model_projection`, `per_layer_projection_norm`) sit on the model;
every norm weight is used as stored (Gemma 4 scales by weight, not 1 + weight). With `enable_moe_block` each group
also holds the MoE block's params and `_layer` adds the experts beside the MLP (models/gemma4/moe_block.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from vllm_jax.model import layer_loop
from vllm_jax.model.aux_hidden import AuxHiddenStates
from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.layers import LayerContext, apply_rotary, init_param, layer_param_values, linear
from vllm_jax.model.quantization import Quantization
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.models.gemma.model import geglu_mlp, rotary_tables_of, soft_cap
from vllm_jax.models.gemma4.moe_block import MATRICES as MOE_MATRICES
from vllm_jax.models.gemma4.moe_block import moe_block, moe_shapes
from vllm_jax.models.gemma4.spec import Gemma4Spec


def gemma4_rms_norm(x: jax.Array, weight: jax.Array | None, eps: float) -> jax.Array:
    """Gemma 4's RMSNorm: normalize and scale by `weight` (None: no scale, the value norm) in float32, then cast
    back."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if weight is not None:
        xf = xf * weight.astype(jnp.float32)
    return xf.astype(x.dtype)


def _pad_to(x: jax.Array, width: int) -> jax.Array:
    """x [..., d] zero-padded to [..., width] (unchanged when d == width)."""
    pad = width - x.shape[-1]
    return x if pad == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])


def group_shapes(spec: Gemma4Spec, group: str, layers: list[int]) -> dict[str, tuple[int, ...]]:
    """name -> stacked shape of one param group's params."""
    first, n, h = layers[0], len(layers), spec.hidden_size
    d, kvh, i = spec.layer_head_dims[first], spec.layer_kv_heads[first], spec.layer_intermediate[first]
    shapes = {"q_proj": (n, h, spec.num_heads * d), "o_proj": (n, spec.num_heads * d, h), "q_norm": (n, d),
              "gate_proj": (n, h, i), "up_proj": (n, h, i), "down_proj": (n, i, h), "layer_scalar": (n, 1)}
    for norm in ("input_norm", "post_attention_norm", "pre_feedforward_norm", "post_feedforward_norm"):
        shapes[norm] = (n, h)
    if not spec.is_shared(first):
        shapes |= {"k_proj": (n, h, kvh * d), "k_norm": (n, d)}
        if not (spec.k_eq_v and spec.is_full(first)):
            shapes["v_proj"] = (n, h, kvh * d)
    if spec.ple_size:
        shapes |= {"per_layer_input_gate": (n, h, spec.ple_size), "per_layer_projection": (n, spec.ple_size, h),
                   "post_per_layer_input_norm": (n, h)}
    return shapes | moe_shapes(spec, n)


def layer_groups(spec: Gemma4Spec) -> dict[str, list[int]]:
    """group name -> its layers, in order (a layer's index in its group is its row of the stacked params)."""
    groups: dict[str, list[int]] = {}
    for layer in range(spec.num_layers):
        groups.setdefault(spec.group_of(layer), []).append(layer)
    return groups


class Gemma4Layers(nnx.Module):
    """Every layer's weights, stacked per group of same-shaped layers: `{group}_{name}` [layers of group, ...]."""

    def __init__(self, spec: Gemma4Spec, dtype, rngs: nnx.Rngs, quant: Quantization | None = None,
                 fuse_qkv: bool = False):
        del quant, fuse_qkv  # quantization is refused by Gemma4LM; its per-layer shapes keep q/k/v apart
        for group, layers in layer_groups(spec).items():
            for name, shape in group_shapes(spec, group, layers).items():
                matrix = name.endswith(("_proj", "_gate")) or name in MOE_MATRICES
                param = init_param(rngs, shape, dtype) if matrix else nnx.Param(jnp.ones(shape, dtype))
                setattr(self, f"{group}_{name}", param)


class Gemma4LM(DecoderLM):
    """Gemma 4 text: `(kv_cache, StepInputs) -> (kv_cache, logits)` like DecoderLM."""

    layers_class = Gemma4Layers
    fuses_projections = False
    switched_scan = False  # a Python loop over the layers; per-layer arrays (--no-scan-layers) index the same way

    def __init__(self, spec: Gemma4Spec, dtype=jnp.float32, *, rngs: nnx.Rngs, attention_backend: str = "auto",
                 platform: str | None = None, mesh=None, expert_mesh=None, expert_axis: str = "model",
                 quantization=None, quantization_group_size=None):
        if quantization is not None:
            name = getattr(quantization, "scheme", None) or ("gguf" if not isinstance(quantization, str) else
                                                             quantization)
            raise ValueError(f"{spec.architecture}: weight quantization ({name}) is not supported for Gemma 4 yet; "
                             "drop --quantization")
        super().__init__(spec, dtype, rngs=rngs, attention_backend=attention_backend, platform=platform,
                         mesh=mesh)
        self.expert_mesh = expert_mesh  # set: the MoE block's experts split over its `expert_axis` (EP)
        self.expert_axis = expert_axis
        if spec.ple_size:
            width = spec.num_layers * spec.ple_size
            self.embed_tokens_per_layer = init_param(rngs, (spec.ple_vocab_size, width), dtype)
            self.per_layer_model_projection = init_param(rngs, (spec.hidden_size, width), dtype)
            self.per_layer_projection_norm = nnx.Param(jnp.ones((spec.ple_size,), dtype))

    def __call__(self, kv_cache: jax.Array, inputs: StepInputs, lora: dict | None = None) -> tuple[jax.Array, ...]:
        """DecoderLM.__call__ with Gemma 4's final norm and the final logit soft cap (float32)."""
        spec = self.spec
        kv_cache, hidden, aux = self.hidden_states(kv_cache, inputs, lora)
        last = gemma4_rms_norm(self._logits_rows(hidden, inputs), self.final_norm[...], spec.rms_norm_eps)
        logits = soft_cap(self._logits(last, inputs), spec.final_soft_cap)
        return (kv_cache, logits) if aux is None else (kv_cache, logits, aux)

    def hidden_states(self, kv_cache: jax.Array, inputs: StepInputs,
                      lora: dict | None = None) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        if lora:
            raise ValueError(f"{self.spec.architecture}: LoRA adapters are not supported for Gemma 4 yet")
        spec = self.spec
        hidden = self._embed(inputs.input_ids) * jnp.asarray(spec.embedding_multiplier, self.final_norm[...].dtype)
        ple = self._per_layer_inputs(inputs.input_ids, hidden) if spec.ple_size else None
        tables = {"sliding": rotary_tables_of(spec.inv_freq, 1.0, inputs.positions),
                  "full": rotary_tables_of(spec.global_inv_freq, 1.0, inputs.positions)}
        aux = AuxHiddenStates.start(self.aux_hidden_layers, spec.num_layers, hidden)

        def step(w: dict, layer: int, hidden: jax.Array, kv_cache: jax.Array) -> tuple[jax.Array, jax.Array]:
            ctx = LayerContext(*tables["full" if spec.is_full(layer) else "sliding"], inputs, self.kernels)
            return self._layer(ctx, w, hidden, kv_cache, layer, None if ple is None else ple[:, layer])

        with self._layers_traced(hidden, inputs):
            hidden, kv_cache, aux = layer_loop.unrolled(step, self._layer_weights(), (hidden, kv_cache, aux))
        return kv_cache, hidden, aux.concatenated()

    def _layer_weights(self) -> Iterator[tuple[dict, int]]:
        """(layer's weights, layer) for every layer in order: its group's params at its row, the group prefix
        dropped."""
        spec = self.spec
        weights = layer_param_values(self.layers)
        groups = layer_groups(spec)
        for layer in range(spec.num_layers):
            group = spec.group_of(layer)
            row, prefix = groups[group].index(layer), f"{group}_"
            yield {name[len(prefix):]: value[row] for name, value in weights.items() if name.startswith(prefix)}, layer

    def _per_layer_inputs(self, ids: jax.Array, embeds: jax.Array) -> jax.Array:
        """PLE [T, layers, ple_size]: (norm(embeds @ projection / sqrt(hidden)) + the token's per-layer rows *
        sqrt(ple_size)) / sqrt(2), as transformers' get_per_layer_inputs / project_per_layer_inputs."""
        spec, t = self.spec, ids.shape[0]
        dtype = embeds.dtype
        token = self._rows(self.embed_tokens_per_layer[...], ids) * jnp.asarray(spec.ple_size ** 0.5, dtype)
        token = token.reshape(t, spec.num_layers, spec.ple_size)
        proj = linear(embeds, self.per_layer_model_projection[...]) * jnp.asarray(spec.hidden_size ** -0.5, dtype)
        proj = gemma4_rms_norm(proj.reshape(t, spec.num_layers, spec.ple_size), self.per_layer_projection_norm[...],
                               spec.rms_norm_eps)
        return (proj + token) * jnp.asarray(2.0 ** -0.5, dtype)

    def _layer(self, ctx: LayerContext, w: dict, hidden: jax.Array, kv_cache: jax.Array, layer: int,
               ple: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        """One layer: norm -> attention -> norm -> residual; norm -> GeGLU (with the MoE block: its norm plus the
        experts' normed output, models/gemma4/moe_block.py) -> norm -> residual; the gated per-layer input -> norm ->
        residual; times layer_scalar."""
        eps = self.spec.rms_norm_eps
        x = gemma4_rms_norm(hidden, w["input_norm"], eps)
        attn, kv_cache = self._attention(ctx, w, x, kv_cache, layer)
        hidden = hidden + gemma4_rms_norm(attn, w["post_attention_norm"], eps)
        ffn = geglu_mlp(w, gemma4_rms_norm(hidden, w["pre_feedforward_norm"], eps))
        if self.spec.num_experts is not None:
            experts = moe_block(self.spec, w, hidden, gemma4_rms_norm, self.expert_mesh, self.expert_axis)
            ffn = (gemma4_rms_norm(ffn, w["post_feedforward_norm_1"], eps)
                   + gemma4_rms_norm(experts, w["post_feedforward_norm_2"], eps))
        hidden = hidden + gemma4_rms_norm(ffn, w["post_feedforward_norm"], eps)
        if ple is not None:
            gate = jax.nn.gelu(linear(hidden, w["per_layer_input_gate"]), approximate=True) * ple
            hidden = hidden + gemma4_rms_norm(linear(gate, w["per_layer_projection"]),
                                              w["post_per_layer_input_norm"], eps)
        return hidden * w["layer_scalar"].astype(hidden.dtype), kv_cache

    def _attention(self, ctx: LayerContext, w: dict, x: jax.Array, kv_cache: jax.Array,
                   layer: int) -> tuple[jax.Array, jax.Array]:
        """q (q norm, rope); on a producing layer k (k norm, rope) and v (value norm; k_proj's output with
        attention_k_eq_v), heads repeated and zero-padded to the cache's, written into its cache layer; the paged
        attention over that layer (q zero-padded alike, the output's padding dropped); o_proj."""
        spec, t, eps = self.spec, x.shape[0], self.spec.rms_norm_eps
        d, kvh = spec.layer_head_dims[layer], spec.layer_kv_heads[layer]
        q = linear(x, w["q_proj"]).reshape(t, spec.num_heads, d)
        q = apply_rotary(gemma4_rms_norm(q, w["q_norm"], eps), ctx.cos, ctx.sin)
        cache_layer, width, heads = spec.cache_layer_of(layer), spec.kv_cache_width, spec.kv_cache_heads // 2
        if not spec.is_shared(layer):
            k_raw = linear(x, w["k_proj"]).reshape(t, kvh, d)
            v = k_raw if "v_proj" not in w else linear(x, w["v_proj"]).reshape(t, kvh, d)
            k = apply_rotary(gemma4_rms_norm(k_raw, w["k_norm"], eps), ctx.cos, ctx.sin)
            v = gemma4_rms_norm(v, None, eps)
            # GQA-equivalent: query head i still meets a copy of its own KV head; zeros add nothing to q.k
            k, v = (_pad_to(jnp.repeat(a, heads // kvh, axis=1), width) for a in (k, v))
            kv_cache = ctx.kernels.write_kv_cache(kv_cache, k, v, ctx.inputs.slot_mapping, cache_layer)
        attn = ctx.kernels.attention(_pad_to(q, width), kv_cache, ctx.inputs, sm_scale=spec.sm_scale,
                                     window=spec.sliding_windows[layer], layer_index=cache_layer)
        return linear(attn[..., :d].reshape(t, spec.num_heads * d), w["o_proj"]), kv_cache

    def _run_layers(self, ctx, hidden, kv_cache, aux: AuxHiddenStates):
        raise NotImplementedError("Gemma4LM runs its layers in hidden_states")

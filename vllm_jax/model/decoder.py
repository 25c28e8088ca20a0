"""The dense Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) as a Flax NNX module over stacked layer params.

Layer weights are stacked on a leading [num_layers] axis and the forward scans over them, so compile time
does not grow with depth. The forward is pure in (params, kv_cache, StepInputs): the worker splits the module
once (`nnx.split`) and jits `forward(graphdef, state, kv_cache, inputs)` below, with the KV cache donated. The
KV cache is the scan's carry and is written through `slot_mapping` at each layer before that layer's
attention reads it; nothing returns a per-layer copy of it. Only the `logits_indices` rows reach the LM head.

`aux_hidden_layers` (static, default off) makes the call also return the residual stream entering those layers
for every token, EAGLE-3's auxiliary hidden states (model/aux_hidden.py).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from vllm_jax.model.aux_hidden import AuxHiddenStates
from vllm_jax.model.grouped_quant import dequantize_grouped, min_name
from vllm_jax.model.layers import (AttentionKernels, LayerContext, LayerSwitch, QuantizedWeight, attention_params,
                                   bundle_quantized, decoder_block, gated_mlp, grouped_params, init_param,
                                   is_unstacked, layer_param_values, linear_params, matmul_f32, rms_norm,
                                   rotary_tables)
from vllm_jax.model.lora_layers import LoRAMask, bundle_lora
from vllm_jax.model.quantized_dots import gguf_dot, gguf_dot_rows, quantized_dot_rows
from vllm_jax.model.quantization import (SCALE_SUFFIX, KeptFormats, OnlineQuantization, Quantization,
                                         quantize_table, scale_name)
from vllm_jax.model.spec import DecoderSpec
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.pallas_kernels import resolve_backend

# A kept (or online-quantized) tied LM head's vocab rows per chunk (quantized_dots.gguf_dot_rows and
# quantized_dot_rows): on CPU so the dequantized chunk stays in cache; on GPU / TPU so no program holds the whole
# table dequantized (the default model's kept head was a 54 MiB bfloat16 temporary on H100;
# docs/architecture/06-model.md, "Quantized weights")
HEAD_CHUNK_ROWS = {"cpu": 1024, "gpu": 8192, "tpu": 8192}


def forward(graphdef: nnx.GraphDef, state: nnx.State, kv_cache: jax.Array, inputs: StepInputs,
            lora: dict | None = None) -> tuple[jax.Array, ...]:
    """Any model here as a pure function of its split state: -> (updated kv_cache, float32 logits [S, vocab]),
    plus the auxiliary hidden states [T, K * hidden] when the model's `aux_hidden_layers` are set. `lora`: the
    stacked adapter slots (worker/lora_slots.py), read through `inputs.lora_slots`; None: no LoRA."""
    model = nnx.merge(graphdef, state)
    return model(kv_cache, inputs) if lora is None else model(kv_cache, inputs, lora=lora)


class DecoderLayers(nnx.Module):
    """All decoder layers' weights, stacked on axis 0 (the linear ones quantized with `quant`)."""

    def __init__(self, spec: DecoderSpec, dtype, rngs: nnx.Rngs, quant: Quantization | None = None):
        n, h, i = spec.num_layers, spec.hidden_size, spec.intermediate_size
        params = {**attention_params(spec, dtype, rngs, quant),
                  **linear_params(rngs, "gate_proj", (n, h, i), dtype, quant),
                  **linear_params(rngs, "up_proj", (n, h, i), dtype, quant),
                  **linear_params(rngs, "down_proj", (n, i, h), dtype, quant)}
        for name, param in params.items():
            setattr(self, name, param)
        if spec.mlp_bias:
            self.gate_bias = nnx.Param(jnp.zeros((n, i), dtype))
            self.up_bias = nnx.Param(jnp.zeros((n, i), dtype))
            self.down_bias = nnx.Param(jnp.zeros((n, h), dtype))


class DecoderLM(nnx.Module):
    """Embeddings, the layers, final norm and LM head: `(kv_cache, StepInputs) -> (kv_cache, logits)`.

    Families with another FFN subclass it, naming their layer-params class (`layers_class`) and overriding
    `_run_layers`."""

    layers_class: type[nnx.Module] = DecoderLayers
    # With per-layer arrays (unstack_layers): scan with switched matmuls (True) or a Python loop (False).
    # The worker sets it before splitting the module; it is static (part of the graphdef).
    scan_layers: bool = True
    switched_scan: bool = True  # whether _run_layers can scan over per-layer arrays (the MoE model cannot)
    # EAGLE-3: the layers whose input state the call also returns ([T, K * hidden], model dtype; vLLM's
    # convention, model/aux_hidden.py). () is off and costs nothing. Static like scan_layers: set it before
    # splitting the module (aux_hidden.eagle3_default_layers gives vLLM's default).
    aux_hidden_layers: tuple[int, ...] = ()
    # one layer's computation (layers.decoder_block's signature): families with another residual / norm layout
    # (model/granite.py, model/olmo2.py) name theirs
    block = staticmethod(decoder_block)

    def __init__(self, spec: DecoderSpec, dtype=jnp.float32, *, rngs: nnx.Rngs, attention_backend: str = "auto",
                 platform: str | None = None, mesh: Mesh | None = None,
                 quantization: str | KeptFormats | OnlineQuantization | None = None,
                 quantization_group_size: int | None = None):
        """`attention_backend` is resolved against `platform` (what the program is built for; None: jax's
        backend, read here once; the runner passes its config's) into `self.kernels`, static like `spec`. `mesh`
        (tensor parallelism): the Pallas kernels run inside shard_map over its "model" axis. `quantization`
        (int8 / fp8, model/quantization.py): the layers' linear weights are stored quantized, and how their
        matmuls run is fixed here for `platform` (`self.quantization`, static); `quantization_group_size`: grouped
        scales over that many input rows (a block-fp8 checkpoint's, model_loader/prequantized.py). A `KeptFormats`
        (--quantization gguf) keeps the file's blocks for the params it names, the embedding / LM head included.
        An `OnlineQuantization` (--quantization int8 / fp8 of a float checkpoint) quantizes the embedding too, one
        scale per vocab row (`embed_tokens_scale` [V, 1]), and an untied LM head per output channel."""
        self.spec = spec
        platform = platform or jax.default_backend()
        self.kernels = AttentionKernels(resolve_backend(attention_backend, platform), platform, mesh)
        self.quantization = Quantization.for_platform(quantization, platform, quantization_group_size)
        quant = self.quantization
        embed_fmt = quant.format_of("embed_tokens") if quant is not None and quant.gguf_kept else None
        if embed_fmt:  # [V, H] kept in GGUF blocks, grouped along hidden
            for name, param in grouped_params("embed_tokens", (spec.vocab_size, spec.hidden_size), embed_fmt,
                                              axis=-1).items():
                setattr(self, name, param)
        elif self._table_quantized():  # [V, H] values, [V, 1] float32 row scales
            table = init_param(rngs, (spec.vocab_size, spec.hidden_size), dtype).get_value()
            values, scale = quantize_table(table, quant.scheme)
            self.embed_tokens, self.embed_tokens_scale = nnx.Param(values), nnx.Param(scale)
        else:
            self.embed_tokens = init_param(rngs, (spec.vocab_size, spec.hidden_size), dtype)
        self.layers = self.layers_class(spec, dtype, rngs, self.quantization)
        self.final_norm = nnx.Param(jnp.ones((spec.hidden_size,), dtype))
        if not spec.tie_word_embeddings:
            head_quant = quant if quant is not None and (quant.gguf_kept or self._untied_head_quantized()) else None
            for name, param in linear_params(rngs, "lm_head", (spec.hidden_size, spec.vocab_size), dtype,
                                             head_quant).items():
                setattr(self, name, param)

    def __call__(self, kv_cache: jax.Array, inputs: StepInputs, lora: dict | None = None) -> tuple[jax.Array, ...]:
        """-> (updated kv_cache, float32 logits [S, vocab]) for the last scheduled token of each row; with
        `aux_hidden_layers` set, (kv_cache, logits, aux hidden states [T, K * hidden]) for every token. `lora`:
        target -> (a [L, N, in, R], b [L, N, R, out]) adapter slots, chosen per token by `inputs.lora_slots`."""
        spec = self.spec
        kv_cache, hidden, aux = self.hidden_states(kv_cache, inputs, lora)
        last = rms_norm(hidden[inputs.logits_indices], self.final_norm[...], spec.rms_norm_eps)
        logits = self._lm_head(last)
        if aux is None:
            return kv_cache, logits
        return kv_cache, logits, aux

    def hidden_states(self, kv_cache: jax.Array, inputs: StepInputs,
                      lora: dict | None = None) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """-> (updated kv_cache, the last layer's output [T, hidden], the aux hidden states [T, K * hidden] or
        None without `aux_hidden_layers`): the forward without the LM head (a draft model's catch-up writes its
        KV cache only)."""
        hidden = self._embed(inputs.input_ids)
        if self.spec.embedding_multiplier != 1.0:  # in the hidden dtype, as transformers multiplies it
            hidden = hidden * jnp.asarray(self.spec.embedding_multiplier, hidden.dtype)
        cos, sin = rotary_tables(self.spec, inputs.positions)
        ctx = LayerContext(cos, sin, inputs, self.kernels)
        if lora:
            num_slots = next(iter(lora.values()))[0].shape[1]
            ctx = LayerContext(cos, sin, inputs, self.kernels, lora, LoRAMask.of(inputs.lora_slots, num_slots))
        aux = AuxHiddenStates.start(self.aux_hidden_layers, self.spec.num_layers, hidden)
        hidden, kv_cache, aux = self._run_layers(ctx, hidden, kv_cache, aux)
        return kv_cache, hidden, None if aux.buffer is None else aux.concatenated()

    def _embed(self, ids: jax.Array) -> jax.Array:
        """The embedding rows of `ids`; kept GGUF blocks (or online-quantized rows) gather their rows' values and
        scales, then dequantize."""
        if self._table_quantized():
            rows = self.embed_tokens[...][ids].astype(jnp.float32) * self.embed_tokens_scale[...][ids]
            return rows.astype(self.final_norm[...].dtype)
        embed_fmt = self._kept_format("embed_tokens")
        if embed_fmt is None:
            return self.embed_tokens[...][ids]
        rows = dequantize_grouped(*(None if part is None else part[ids] for part in self._kept_parts("embed_tokens")),
                                  embed_fmt, axis=-1)
        return rows.astype(self.final_norm[...].dtype)

    def _lm_head(self, last: jax.Array) -> jax.Array:
        """float32 logits of the normed last states: x @ E^T (tied) or x @ lm_head, kept GGUF blocks dequantized
        inside the dot (groups along hidden, the contracted dim, either way); online-quantized ones scaled per
        vocab entry (a tied table's values converted inside the dot: `quantized_dot_rows`)."""
        chunk_rows = HEAD_CHUNK_ROWS.get(self.kernels.platform)
        if not self.spec.tie_word_embeddings:
            if self._untied_head_quantized():  # [H, V] per output channel, like the layers' linears
                head = QuantizedWeight(self.lm_head[...], self.lm_head_scale[...],
                                       self.quantization.quantize_activations)
                return matmul_f32(last, head)
            head_fmt = self._kept_format("lm_head")
            if head_fmt is None:
                return jnp.dot(last, self.lm_head[...], preferred_element_type=jnp.float32)
            return gguf_dot(last, *self._kept_parts("lm_head"), head_fmt)
        embed_fmt = self._kept_format("embed_tokens")
        if embed_fmt is None:
            if self._table_quantized():
                return quantized_dot_rows(last, self.embed_tokens[...], self.embed_tokens_scale[...], chunk_rows)
            return jnp.dot(last, self.embed_tokens[...].T, preferred_element_type=jnp.float32)
        return gguf_dot_rows(last, *self._kept_parts("embed_tokens"), embed_fmt, chunk_rows)

    def _untied_head_quantized(self) -> bool:
        """An untied LM head is quantized online (int8 / fp8 values, float32 scales per vocab entry)."""
        return self.quantization is not None and self.quantization.embedding

    def _table_quantized(self) -> bool:
        """Whether the embedding table (and so a tied LM head) is quantized online, which it is except on TPU:
        there XLA's program for Llama-3-8B read ~1.1 GB more per decode step with an int8 table than the gathered
        rows need (the whole table, converted; v6e batch 1: 9.27 GB for 8.17 needed, roofline 5.01 -> 5.65 ms), so
        TPU keeps it in the model dtype (docs/architecture/06-model.md, "Quantized weights")."""
        return self._untied_head_quantized() and self.kernels.platform != "tpu"

    def _kept_format(self, name: str) -> str | None:
        quant = self.quantization
        return quant.format_of(name) if quant is not None and quant.gguf_kept else None

    def _kept_parts(self, name: str) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """(values, scale, min or None) of a param kept in GGUF blocks."""
        minimum = getattr(self, min_name(name), None)
        return (getattr(self, name)[...], getattr(self, scale_name(name))[...],
                None if minimum is None else minimum[...])

    def _run_layers(self, ctx: LayerContext, hidden: jax.Array, kv_cache: jax.Array,
                    aux: AuxHiddenStates) -> tuple[jax.Array, jax.Array, AuxHiddenStates]:
        """All layers: a scan over the stacked params; over per-layer arrays (`unstack_layers`), a scan whose
        matmuls pick their layer's array through a switch (`scan_layers`, the CPU form) or a Python loop. `aux`
        records each chosen layer's input on the way."""
        layer_weights = layer_param_values(self.layers)
        if is_unstacked(layer_weights) and not self.scan_layers:
            return self._run_unrolled(ctx, layer_weights, hidden, kv_cache, aux)
        per_layer, stacked = {}, layer_weights
        if is_unstacked(layer_weights):  # matrices go through LayerSwitch; vectors (norms, biases) restack
            # grouped scales [in // g, out] (block fp8) restack: linear weights each layer's partial sums by them
            grouped = self.quantization is not None and self.quantization.group_size is not None
            per_layer = {name: value for name, value in layer_weights.items()
                         if value[0].ndim == 2 and not (grouped and name.endswith(SCALE_SUFFIX))}
            stacked = {name: jnp.stack(value) for name, value in layer_weights.items() if name not in per_layer}

        def layer(carry, xs):
            hidden, kv_cache, aux = carry
            w, layer_index, window = xs
            w = w | {name: LayerSwitch(arrays, layer_index) for name, arrays in per_layer.items()}
            w = bundle_lora(bundle_quantized(w, self.quantization), ctx.lora, ctx.lora_mask, layer_index)
            aux = aux.record(layer_index, hidden)
            hidden, kv_cache = self._block(ctx, w, hidden, kv_cache, layer_index, window)
            return (hidden, kv_cache, aux), None

        num_layers = self.spec.num_layers
        windows = jnp.asarray(np.array(self.spec.sliding_windows, dtype=np.int32))
        xs = (stacked, jnp.arange(num_layers, dtype=jnp.int32), windows)
        (hidden, kv_cache, aux), _ = jax.lax.scan(layer, (hidden, kv_cache, aux), xs)
        return hidden, kv_cache, aux

    def _run_unrolled(self, ctx: LayerContext, layer_weights: dict, hidden: jax.Array, kv_cache: jax.Array,
                      aux: AuxHiddenStates) -> tuple[jax.Array, jax.Array, AuxHiddenStates]:
        """The layers as a Python loop over per-layer arrays (--no-scan-layers)."""
        for i in range(self.spec.num_layers):
            w = bundle_quantized({name: value[i] for name, value in layer_weights.items()}, self.quantization)
            w = bundle_lora(w, ctx.lora, ctx.lora_mask, i)
            aux = aux.record(i, hidden)
            hidden, kv_cache = self._block(ctx, w, hidden, kv_cache, i, self.spec.sliding_windows[i])
        return hidden, kv_cache, aux

    def _block(self, ctx: LayerContext, w: dict, hidden: jax.Array, kv_cache: jax.Array,
               layer_index: jax.Array | int, window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
        """One layer from its weights `w`: `block` (the pre-norm block, or a family's residual / norm layout) with
        the SiLU-gated MLP. A family with another MLP too (Gemma: model/gemma.py) overrides this and keeps the scan /
        switch / LoRA machinery above."""
        return self.block(self.spec, ctx, w, partial(gated_mlp, w), hidden, kv_cache, layer_index, window)

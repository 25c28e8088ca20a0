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

from contextlib import AbstractContextManager
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from vllm_jax.attention import attention_backend_for
from vllm_jax.model import layer_loop
from vllm_jax.model.aux_hidden import AuxHiddenStates
from vllm_jax.model.embedding_head import EmbeddingHead
from vllm_jax.model.fused_projections import fuses_qkv
from vllm_jax.model.layers import (
    AttentionKernels,
    LayerContext,
    attention_params,
    decoder_block,
    gated_mlp,
    layer_param_values,
    linear_params,
    rms_norm,
    rotary_tables,
)
from vllm_jax.model.quantization import KeptFormats, OnlineQuantization, Quantization
from vllm_jax.model.spec import DecoderSpec
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.model.weight_forms.lora import LoRAMask
from vllm_jax.native import gguf_matvec
from vllm_jax.pallas_kernels.precision import model_matmuls
from vllm_jax.sharding.mesh import MODEL_AXIS


def forward(graphdef: nnx.GraphDef, state: nnx.State, kv_cache: jax.Array, inputs: StepInputs,
            lora: dict | None = None) -> tuple[jax.Array, ...]:
    """Any model here as a pure function of its split state: -> (updated kv_cache, float32 logits [S, vocab]),
    plus the auxiliary hidden states [T, K * hidden] when the model's `aux_hidden_layers` are set. `lora`: the
    stacked adapter slots (lora/device/slots.py), read through `inputs.lora_slots`; None: no LoRA."""
    model = nnx.merge(graphdef, state)
    with model_matmuls(state):
        return model(kv_cache, inputs) if lora is None else model(kv_cache, inputs, lora=lora)


class DecoderLayers(nnx.Module):
    """All decoder layers' weights, stacked on axis 0 (the linear ones quantized with `quant`; q/k/v one weight with
    `fuse_qkv`: model/fused_projections.py)."""

    def __init__(self, spec: DecoderSpec, dtype, rngs: nnx.Rngs, quant: Quantization | None = None,
                 fuse_qkv: bool = False):
        n, h, i = spec.num_layers, spec.hidden_size, spec.intermediate_size
        params = {**attention_params(spec, dtype, rngs, quant, fuse_qkv),
                  **linear_params(rngs, "gate_proj", (n, h, i), dtype, quant),
                  **linear_params(rngs, "up_proj", (n, h, i), dtype, quant),
                  **linear_params(rngs, "down_proj", (n, i, h), dtype, quant)}
        for name, param in params.items():
            setattr(self, name, param)
        if spec.mlp_bias:
            self.gate_bias = nnx.Param(jnp.zeros((n, i), dtype))
            self.up_bias = nnx.Param(jnp.zeros((n, i), dtype))
            self.down_bias = nnx.Param(jnp.zeros((n, h), dtype))


class DecoderLM(EmbeddingHead, nnx.Module):
    """Embeddings, the layers, final norm and LM head: `(kv_cache, StepInputs) -> (kv_cache, logits)`.

    The forward below is the transformer; the embedding table and LM head in their stored forms are
    `EmbeddingHead`'s (model/embedding_head.py), the loop over the layers (its three forms and the aux states'
    recording) model/layer_loop.py's. Families with another FFN or layer name their layer-params class
    (`layers_class`) and override `_block`, or `_run_layers` for another loop."""

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
    # whether `layers_class` takes fused q/k/v (model/fused_projections.py) when the weights and the mesh allow
    fuses_projections = True

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
        self.kernels = AttentionKernels(attention_backend_for(attention_backend, platform), mesh)
        self.quantization = Quantization.for_platform(quantization, platform, quantization_group_size)
        self._init_embedding(dtype, rngs)
        tp = 1 if mesh is None else mesh.shape[MODEL_AXIS]
        fuse = self.fuses_projections and fuses_qkv(spec, self.quantization, tp)
        self.layers = self.layers_class(spec, dtype, rngs, self.quantization, fuse)
        self.final_norm = nnx.Param(jnp.ones((spec.hidden_size,), dtype))
        self._init_lm_head(dtype, rngs)

    def __call__(self, kv_cache: jax.Array, inputs: StepInputs, lora: dict | None = None) -> tuple[jax.Array, ...]:
        """-> (updated kv_cache, float32 logits [S, vocab]) for the last scheduled token of each row; with
        `aux_hidden_layers` set, (kv_cache, logits, aux hidden states [T, K * hidden]) for every token. `lora`:
        target -> (a [L, N, in, R], b [L, N, R, out]) adapter slots, chosen per token by `inputs.lora_slots`."""
        spec = self.spec
        kv_cache, hidden, aux = self.hidden_states(kv_cache, inputs, lora)
        last = rms_norm(self._logits_rows(hidden, inputs), self.final_norm[...], spec.rms_norm_eps)
        logits = self._logits(last, inputs)
        if aux is None:
            return kv_cache, logits
        return kv_cache, logits, aux

    def hidden_states(self, kv_cache: jax.Array, inputs: StepInputs,
                      lora: dict | None = None) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """-> (updated kv_cache, the last layer's output [T, hidden], the aux hidden states [T, K * hidden] or
        None without `aux_hidden_layers`): the forward without the LM head (a draft model's catch-up writes its
        KV cache only)."""
        hidden = self._input_embeddings(inputs)
        cos, sin = self._rotary_tables(inputs)
        ctx = LayerContext(cos, sin, inputs, self.kernels)
        if lora:
            num_slots = next(iter(lora.values()))[0].shape[1]
            ctx = LayerContext(cos, sin, inputs, self.kernels, lora, LoRAMask.of(inputs.lora_slots, num_slots))
        aux = AuxHiddenStates.start(self.aux_hidden_layers, self.spec.num_layers, hidden)
        with self._layers_traced(hidden, inputs):
            hidden, kv_cache, aux = self._run_layers(ctx, hidden, kv_cache, aux)
        return kv_cache, hidden, aux.concatenated()

    def _layers_traced(self, hidden: jax.Array, inputs: StepInputs) -> AbstractContextManager[None]:
        """The context the layers are traced in for CPU's native dots: the bucket's padding tokens follow the real
        ones, so the dots skip them; over a mesh the dots stay XLA's (`gguf_matvec.padded_rows`)."""
        return gguf_matvec.padded_rows(hidden.shape[0], inputs.query_start_loc[inputs.num_seqs[0]],
                                       sharded=self.kernels.mesh is not None)

    def _input_embeddings(self, inputs: StepInputs) -> jax.Array:
        """[T, hidden]: the tokens' embeddings (a vision-language model puts its image tokens in)."""
        hidden = self._embed(inputs.input_ids)
        if self.spec.embedding_multiplier != 1.0:  # in the hidden dtype, as transformers multiplies it
            hidden = hidden * jnp.asarray(self.spec.embedding_multiplier, hidden.dtype)
        return hidden

    def _rotary_tables(self, inputs: StepInputs) -> tuple[jax.Array, jax.Array]:
        """cos, sin [T, head_dim] for the step's positions (M-RoPE's three streams: model/qwen2_5_vl.py)."""
        return rotary_tables(self.spec, inputs.positions)

    def _run_layers(self, ctx: LayerContext, hidden: jax.Array, kv_cache: jax.Array,
                    aux: AuxHiddenStates) -> tuple[jax.Array, jax.Array, AuxHiddenStates]:
        """All layers, in the form their params are in (model/layer_loop.py): a scan over stacked params; over
        per-layer arrays (`unstack_layers`) the switched scan (`scan_layers`, the CPU form, where the family's
        `switched_scan` allows it) or a Python loop. `aux` records each chosen layer's input on the way."""
        return layer_loop.run_layers(self._block, ctx, layer_param_values(self.layers), self.spec.sliding_windows,
                                     self.quantization, (hidden, kv_cache, aux),
                                     switched=self.scan_layers and self.switched_scan)

    def _block(self, ctx: LayerContext, w: dict, hidden: jax.Array, kv_cache: jax.Array,
               layer_index: jax.Array | int, window: jax.Array | int) -> tuple[jax.Array, jax.Array]:
        """One layer from its weights `w`: `block` (the pre-norm block, or a family's residual / norm layout) with
        the SiLU-gated MLP. A family with another MLP too (Gemma: model/gemma.py) overrides this and keeps the scan /
        switch / LoRA machinery of layer_loop.run_layers."""
        return self.block(self.spec, ctx, w, partial(gated_mlp, w), hidden, kv_cache, layer_index, window)

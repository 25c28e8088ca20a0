"""The EAGLE-3 draft head (`LlamaForCausalLMEagle3`) as a Flax NNX module over its own one-layer paged KV cache.

One draft step, per token (vLLM's llama_eagle3.py order of operations):

    feature  = fc(aux states [T, 3 * target_hidden])   first step: the target's auxiliary hidden states
             | the head's own previous output [T, H]   later steps (no fc)
    x        = concat(input_norm(embed(token)), hidden_norm(feature))         [T, 2H]
    h        = feature + o_proj(attention(q/k/v(x)))  (the residual is hidden_norm(feature) when
                                                       `norm_before_residual`)
    h        = h + mlp(post_attention_norm(h))        -> returned for the next step (pre-norm, as vLLM feeds it)
    logits   = lm_head(norm(h[logits_indices]))       [S, draft_vocab], float32

The attention is the target decoder's (`layers.attention`: rotary, KV write through `slot_mapping`, ragged paged
attention through `AttentionKernels`), so the head runs with the xla backend and the Pallas kernels alike. Its
KV cache has the target's layout with one layer: [1, num_blocks, block_size, 2 * kv_heads, head_dim]. Draft ids
map to target ids through `d2t` (target = draft + d2t[draft]). Without its own `embed_tokens` the head reads
the target's embedding, passed to the call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from vllm_jax.attention import attention_backend_for
from vllm_jax.model.layers import (
    AttentionKernels,
    LayerContext,
    attention,
    gated_mlp,
    init_param,
    linear,
    matmul_f32,
    rms_norm,
    rotary_tables,
)
from vllm_jax.model.row_gather import take_rows
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.native import gguf_matvec
from vllm_jax.pallas_kernels.precision import model_matmuls
from vllm_jax.spec_decode.device.eagle3_spec import Eagle3Spec


class VocabMap(nnx.Variable):
    """An int32 id table (`d2t`): state like a param, but never cast to the model dtype (bfloat16 cannot hold
    ids past 256 exactly)."""


class Eagle3Layer(nnx.Module):
    """The head's one decoder layer (`midlayer`): q/k/v read [embedding, feature] (2H); the rest is Llama's."""

    def __init__(self, spec: Eagle3Spec, dtype, rngs: nnx.Rngs):
        h, layer = spec.hidden_size, spec.layer
        self.input_norm = nnx.Param(jnp.ones((h,), dtype))
        self.hidden_norm = nnx.Param(jnp.ones((h,), dtype))
        self.post_attention_norm = nnx.Param(jnp.ones((h,), dtype))
        self.q_proj = init_param(rngs, (2 * h, layer.q_size), dtype)
        self.k_proj = init_param(rngs, (2 * h, layer.kv_size), dtype)
        self.v_proj = init_param(rngs, (2 * h, layer.kv_size), dtype)
        self.o_proj = init_param(rngs, (layer.q_size, h), dtype)
        self.gate_proj = init_param(rngs, (h, layer.intermediate_size), dtype)
        self.up_proj = init_param(rngs, (h, layer.intermediate_size), dtype)
        self.down_proj = init_param(rngs, (layer.intermediate_size, h), dtype)


class Eagle3Head(nnx.Module):
    """`(kv_cache, StepInputs, features, from_target=...) -> (kv_cache, hidden [T, H], logits [S, draft_vocab])`.

    `own_embedding`: the checkpoint carries `embed_tokens` (otherwise the call takes the target's). The kernels
    are resolved as the target decoder's are (DecoderLM.__init__)."""

    def __init__(self, spec: Eagle3Spec, dtype=jnp.float32, *, rngs: nnx.Rngs, own_embedding: bool = False,
                 attention_backend: str = "auto", platform: str | None = None, mesh: Mesh | None = None):
        self.spec = spec
        platform = platform or jax.default_backend()
        self.kernels = AttentionKernels(attention_backend_for(attention_backend, platform), mesh)
        h = spec.hidden_size
        self.fc = init_param(rngs, (spec.num_aux_layers * spec.target_hidden_size, h), dtype)
        self.midlayer = Eagle3Layer(spec, dtype, rngs)
        self.final_norm = nnx.Param(jnp.ones((h,), dtype))
        self.lm_head = init_param(rngs, (h, spec.draft_vocab_size), dtype)
        self.d2t = VocabMap(jnp.zeros((spec.draft_vocab_size,), jnp.int32))
        if own_embedding:
            self.embed_tokens = init_param(rngs, (spec.vocab_size, h), dtype)

    def __call__(self, kv_cache: jax.Array, inputs: StepInputs, features: jax.Array, *, from_target: bool,
                 embed_tokens: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One draft forward over a ragged batch. `features`: the target's aux states [T, 3 * target_hidden]
        (`from_target=True`, projected by fc) or the head's previous `hidden` [T, H] (static flag: the shapes
        differ). `embed_tokens`: the target's [vocab, H] embedding, read only when the head has none.
        -> (updated kv_cache, pre-norm hidden [T, H] for the next step, float32 logits [S, draft_vocab] for the
        `logits_indices` rows)."""
        tokens = inputs.input_ids.shape[0]
        # every row computed (the next step reads this one's hidden rows); over a mesh, no native CPU kernel
        with gguf_matvec.padded_rows(tokens, jnp.int32(tokens), sharded=self.kernels.mesh is not None):
            return self._forward(kv_cache, inputs, features, from_target, embed_tokens)

    def _forward(self, kv_cache: jax.Array, inputs: StepInputs, features: jax.Array, from_target: bool,
                 embed_tokens: jax.Array | None) -> tuple[jax.Array, jax.Array, jax.Array]:
        spec, layer = self.spec, self.spec.layer
        sharded = self.kernels.mesh is not None
        feature = self._feature(features, from_target)
        embeds = take_rows(self._embedding(embed_tokens), inputs.input_ids, sharded=sharded)
        w = {name: p.get_value() for name, p in vars(self.midlayer).items() if isinstance(p, nnx.Param)}
        normed_feature = rms_norm(feature, w["hidden_norm"], layer.rms_norm_eps)
        residual = normed_feature if spec.norm_before_residual else feature
        x = jnp.concatenate([rms_norm(embeds, w["input_norm"], layer.rms_norm_eps), normed_feature], axis=-1)
        cos, sin = rotary_tables(layer, inputs.positions)
        ctx = LayerContext(cos, sin, inputs, self.kernels)
        attn, kv_cache = attention(layer, ctx, w, x, kv_cache, 0, 0)
        hidden = residual + attn
        hidden = hidden + gated_mlp(w, rms_norm(hidden, w["post_attention_norm"], layer.rms_norm_eps))
        last = rms_norm(take_rows(hidden, inputs.logits_indices, sharded=sharded), self.final_norm[...],
                        layer.rms_norm_eps)
        return kv_cache, hidden, matmul_f32(last, self.lm_head[...])

    def _feature(self, features: jax.Array, from_target: bool) -> jax.Array:
        spec = self.spec
        want = spec.num_aux_layers * spec.target_hidden_size if from_target else spec.hidden_size
        if features.ndim != 2 or features.shape[-1] != want:
            source = "the target's aux hidden states" if from_target else "the head's previous hidden states"
            raise ValueError(f"EAGLE-3 features from {source} must be [T, {want}]; got {tuple(features.shape)}")
        if not from_target:
            return features
        return linear(features, self.fc[...])

    def _embedding(self, embed_tokens: jax.Array | None) -> jax.Array:
        if hasattr(self, "embed_tokens"):
            return self.embed_tokens[...]
        spec = self.spec
        if embed_tokens is None:
            raise ValueError("this EAGLE-3 head has no embed_tokens of its own: pass the target's embedding")
        if tuple(embed_tokens.shape) != (spec.vocab_size, spec.hidden_size):
            raise ValueError(f"the target's embedding is {tuple(embed_tokens.shape)}; the head needs "
                             f"[{spec.vocab_size}, {spec.hidden_size}] (vocab_size, hidden_size)")
        return embed_tokens


def eagle3_forward(graphdef: nnx.GraphDef, state: nnx.State, kv_cache: jax.Array, inputs: StepInputs,
                   features: jax.Array, embed_tokens: jax.Array | None, from_target: bool
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The head as a pure function of its split state, for `jax.jit(..., static_argnames="from_target",
    donate_argnums=2)`: -> (kv_cache, hidden [T, H], float32 logits [S, draft_vocab])."""
    with model_matmuls(state):  # pallas_kernels/precision.py
        return nnx.merge(graphdef, state)(kv_cache, inputs, features, from_target=from_target,
                                          embed_tokens=embed_tokens)


def eagle3_kv_cache_shape(spec: Eagle3Spec, num_blocks: int, block_size: int) -> tuple[int, ...]:
    """The head's KV cache: the target's layout (docs/architecture/04-kv-cache.md, "KV cache layout") with one layer."""
    return (1, num_blocks, block_size, 2 * spec.layer.num_kv_heads, spec.layer.head_dim)


def draft_to_target_ids(draft_ids: jax.Array, d2t: jax.Array) -> jax.Array:
    """Target-vocabulary ids of draft-vocabulary ids: `draft + d2t[draft]` (the published d2t holds offsets)."""
    return draft_ids + d2t[draft_ids]


def target_vocab_logits(draft_logits: jax.Array, d2t: jax.Array, vocab_size: int) -> jax.Array:
    """[S, draft_vocab] logits spread over the target vocabulary [S, vocab_size], -inf where the draft
    vocabulary has no token (vLLM's compute_logits): what a sampled proposal's q(x) is read from."""
    targets = draft_to_target_ids(jnp.arange(draft_logits.shape[-1], dtype=jnp.int32), d2t)
    full = jnp.full((draft_logits.shape[0], vocab_size), -jnp.inf, draft_logits.dtype)
    return full.at[:, targets].set(draft_logits)

"""The decoder of hybrid models: attention layers over the paged K/V beside recurrent layers over per-sequence
state slots, in one Python loop over the layers (the two kinds have different params; each param group is stacked
over the layers that have it). The families (models/qwen3_5/, models/granite_hybrid/) say what one layer of each
kind computes; the loop reads and writes the states (docs/architecture/17-state-cache.md, "The step's states")."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax

from vllm_jax.model.aux_hidden import AuxHiddenStates
from vllm_jax.model.decoder import DecoderLM
from vllm_jax.model.layers import LayerContext, layer_param_values
from vllm_jax.model.spec import DecoderSpec
from vllm_jax.model.ssm.ragged import read_states, starts_fresh, write_states
from vllm_jax.model.state_cache import HybridCache
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.model.weight_forms.bundle import bundle_quantized

ATTENTION, RECURRENT = "attention", "recurrent"


@dataclass(frozen=True)
class HybridSpec(DecoderSpec):
    """A decoder whose layers are of two kinds: `layer_kinds` holds ATTENTION or RECURRENT per layer."""

    layer_kinds: tuple[str, ...] = field(default=(), kw_only=True)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_kinds) if kind == ATTENTION)

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_kinds) if kind == RECURRENT)

    @property
    def num_cache_layers(self) -> int:
        """Only the attention layers keep K/V in the paged cache."""
        return len(self.attention_layers)


def layer_kinds_of(arch: str, layer_types: list[str], attention: set[str], recurrent: set[str]) -> tuple[str, ...]:
    """A config's `layer_types` as ATTENTION / RECURRENT, any other type refused by name."""
    unknown = sorted(set(layer_types) - attention - recurrent)
    if unknown:
        raise ValueError(f"{arch}: layer types {unknown} are not supported (only {sorted(attention | recurrent)})")
    return tuple(ATTENTION if kind in attention else RECURRENT for kind in layer_types)


class HybridDecoderLM(DecoderLM):
    """DecoderLM over a HybridCache. A family names the params stacked over the attention layers and over the
    recurrent layers (the rest are stacked over every layer) and gives one layer of each kind."""

    fuses_projections = False
    switched_scan = False
    attention_params: frozenset[str] = frozenset()
    recurrent_params: frozenset[str] = frozenset()

    def _run_layers(self, ctx: LayerContext, hidden: jax.Array, cache: HybridCache,
                    aux: AuxHiddenStates) -> tuple[jax.Array, HybridCache, AuxHiddenStates]:
        spec, inputs = self.spec, ctx.inputs
        if inputs.state_slots is None:
            raise ValueError("a hybrid model's step needs its rows' state slots (StepInputs.state_reads / state_slots "
                             "/ state_snapshots: pack_step_inputs(..., state_slots=True))")
        weights = layer_param_values(self.layers)
        fresh = starts_fresh(inputs.seq_lens, inputs.query_start_loc, inputs.num_seqs)
        reads, writes = inputs.state_reads, (inputs.state_slots, inputs.state_snapshots)
        kv, conv, recurrent = cache.kv, cache.conv, cache.recurrent
        attention_at = {layer: i for i, layer in enumerate(spec.attention_layers)}
        recurrent_at = {layer: i for i, layer in enumerate(spec.recurrent_layers)}
        for layer in range(spec.num_layers):
            aux = aux.record(layer, hidden)
            w = self._layer_weights(weights, layer, attention_at.get(layer), recurrent_at.get(layer))
            if layer in attention_at:
                hidden, kv = self._attention_layer(ctx, w, hidden, kv, attention_at[layer])
                continue
            k = recurrent_at[layer]
            hidden, conv_end, recurrent_end = self._recurrent_layer(
                w, hidden, read_states(conv[k], reads, fresh), read_states(recurrent[k], reads, fresh), inputs)
            conv = write_states(conv, k, writes, conv_end)
            recurrent = write_states(recurrent, k, writes, recurrent_end)
        return hidden, HybridCache(kv, conv, recurrent), aux

    def _layer_weights(self, weights: dict, layer: int, attention: int | None, recurrent: int | None) -> dict:
        """Layer `layer`'s weights: each param group indexed by the layer's place in the group's stack."""
        w = {}
        for name, values in weights.items():
            index = (attention if name in self.attention_params else recurrent if name in self.recurrent_params
                     else layer)
            if index is not None:
                w[name] = values[index]
        return bundle_quantized(w, self.quantization)

    def _attention_layer(self, ctx: LayerContext, w: dict, hidden: jax.Array, kv: jax.Array,
                         cache_layer: int) -> tuple[jax.Array, jax.Array]:
        """One attention layer (its mixer, MLP and residuals) over the cache's `cache_layer`."""
        raise NotImplementedError

    def _recurrent_layer(self, w: dict, hidden: jax.Array, conv: jax.Array, recurrent: jax.Array,
                         inputs: StepInputs) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One recurrent layer from each row's starting states -> (hidden, conv end states, recurrent end states)."""
        raise NotImplementedError

"""The EAGLE-3 head on the device: its params, its own one-layer KV cache, and its one program.

`eagle3` speculation (docs/architecture/08-sampling.md, "Speculative decoding"). The target's forward also returns three
layers' hidden states for every token (`DecoderLM.aux_hidden_layers`). After the target's step the head runs,
in one program:

- catch-up: every token the target kept this step (its rejected proposals dropped), at the target's positions
  and slots, fed the *next* token (EAGLE's shift: position p sees token p + 1) and the target's states at p
  (through `fc`); the last kept token of each row predicts proposal 1;
- chain: k - 1 one-token steps per request, each fed the previous proposal and the head's own output state
  (packed like the draft model's chain, `spec_decode/device/draft_chain.py`).

In a multi-host run every process runs the program on the same inputs (process 0 broadcasts the catch-up's and
the chain's; the aux states are each process's own from the step it just ran), as the draft model's chain.
Like the draft model's, the head's cache has the target's block count and every request uses the same block ids
in both, so the block manager allocates and frees it with the target's. Proposals are the head's argmax mapped to
target ids (`d2t`): q is one-hot, so verification is the n-gram's (sample/sampler.py, `verify_proposals`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vllm_jax.config import EngineConfig
from vllm_jax.model.aux_hidden import check_aux_layers, eagle3_default_layers
from vllm_jax.spec_decode.device.eagle3_head import draft_to_target_ids
from vllm_jax.spec_decode.device.eagle3_spec import Eagle3Spec
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.pallas_kernels.precision import model_matmuls
from vllm_jax.sharding import kv_cache_partition_spec
from vllm_jax.worker.device_step import _fetch, _replicator, input_signature
from vllm_jax.spec_decode.device.draft_chain import ChainInputs
from vllm_jax.spec_decode.device.draft_step import DraftCacheLayout, LoadOrCompile
from vllm_jax.worker.kv_cache import KVCacheShape, bytes_per_block


def eagle3_aux_layers(head_dir: str, num_layers: int) -> tuple[int, ...]:
    """The target layers whose input states the head reads: its config's `eagle_aux_hidden_state_layer_ids`
    (top level or in `eagle_config`), else vLLM's default (early, middle, late)."""
    config = json.loads((Path(head_dir) / "config.json").read_text())
    layers = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    layers = tuple(layers) if layers else eagle3_default_layers(num_layers)
    try:
        layers = check_aux_layers(layers, num_layers)
    except ValueError as exc:
        raise ValueError(f"speculative_config.model {head_dir!r}: its auxiliary layers {layers} do not fit the "
                         f"target ({exc}); set eagle_aux_hidden_state_layer_ids in its config.json") from None
    if len(layers) != 3:
        raise ValueError(f"speculative_config.model {head_dir!r}: an EAGLE-3 head reads 3 target layers; its "
                         f"config names {len(layers)}")
    return layers


def eagle_cache_layout(config: EngineConfig, spec: Eagle3Spec, mesh: Mesh) -> DraftCacheLayout:
    """The head's one-layer cache on the target's mesh, split on its own KV heads like the target's cache."""
    layer, block_size = spec.layer, config.cache_config.block_size
    dtype, tp = config.model_config.kv_cache_dtype, config.parallel_config.tensor_parallel_size
    lane_dense = config.resolved_attention_backend.lane_dense  # pallas_tpu's layout (kv_layout.py)
    kv_spec = kv_cache_partition_spec(layer, tp, lane_dense)
    num_shards = tp if kv_spec != PartitionSpec() else 1
    shape = KVCacheShape(1, 0, block_size, layer.num_kv_heads, layer.head_dim, dtype, lane_dense=lane_dense)
    per_block = bytes_per_block(1, block_size, layer.num_kv_heads, layer.head_dim, dtype, lane_dense) // num_shards
    return DraftCacheLayout(shape, NamedSharding(mesh, kv_spec), per_block)


class EagleStep:
    def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, kv_cache: jax.Array, num_speculative_tokens: int,
                 embed_tokens: jax.Array | None, load_or_compile: LoadOrCompile,
                 on_trace: Callable[[], None] = lambda: None):
        """`embed_tokens`: the target's embedding, for a head without its own (None: it has one)."""
        self.graphdef, self.params, self.kv_cache = graphdef, params, kv_cache
        self.k = num_speculative_tokens
        self.embed_tokens = embed_tokens
        self.on_trace = on_trace
        self._load_or_compile = load_or_compile
        self._executables: dict[tuple, Any] = {}
        replicated = NamedSharding(kv_cache.sharding.mesh, PartitionSpec())
        self._to_device = _replicator(replicated)  # numpy -> global arrays with several processes
        self._propose = jax.jit(self._propose_impl, donate_argnums=(1,),
                                out_shardings=(kv_cache.sharding, replicated))

    def _propose_impl(self, params, kv_cache, embed_tokens, aux, gather, catch_up: StepInputs,
                      chain: ChainInputs | None):
        self.on_trace()
        with model_matmuls(params):  # pallas_kernels/precision.py
            return self._propose_traced(nnx.merge(self.graphdef, params), kv_cache, embed_tokens, aux, gather,
                                        catch_up, chain)

    def _propose_traced(self, head, kv_cache, embed_tokens, aux, gather, catch_up: StepInputs,
                        chain: ChainInputs | None):
        """The proposal program's body, traced under the model's matmul precision (see _propose_impl)."""
        d2t = head.d2t[...]
        kv_cache, hidden, logits = head(kv_cache, catch_up, aux[gather], from_target=True, embed_tokens=embed_tokens)
        token_ids = draft_to_target_ids(jnp.argmax(logits, axis=-1).astype(jnp.int32), d2t)  # [S]
        if chain is None:
            return kv_cache, token_ids[None]
        state = hidden[catch_up.logits_indices]  # [S, H]: one chain token per row (T = S)

        def one(carry, xs):
            kv_cache, token_ids, state = carry
            positions, slot_mapping, seq_lens = xs
            inputs = StepInputs(token_ids, positions, slot_mapping, chain.block_tables, seq_lens,
                                chain.query_start_loc, chain.num_seqs, chain.logits_indices)
            kv_cache, hidden, logits = head(kv_cache, inputs, state, from_target=False, embed_tokens=embed_tokens)
            token_ids = draft_to_target_ids(jnp.argmax(logits, axis=-1).astype(jnp.int32), d2t)
            return (kv_cache, token_ids, hidden), token_ids

        xs = (chain.positions, chain.slot_mapping, chain.seq_lens)
        (kv_cache, _, _), rest = jax.lax.scan(one, (kv_cache, token_ids, state), xs)
        return kv_cache, jnp.concatenate([token_ids[None], rest])  # [k, S]

    def _args(self, aux, gather, catch_up: StepInputs, chain: ChainInputs | None) -> tuple:
        return (self.params, self.kv_cache, self.embed_tokens, aux) + self._to_device((gather, catch_up, chain))

    def dispatch(self, aux: jax.Array, gather: np.ndarray, catch_up: StepInputs,
                 chain: ChainInputs | None) -> jax.Array:
        """Run the catch-up and chain (not waited for): [k, S] proposals, replicated."""
        args = self._args(aux, gather, catch_up, chain)
        program = self._executables.get(("eagle3", input_signature(args[3:])), self._propose)
        self.kv_cache, proposed = program(*args)
        return proposed

    def propose(self, aux: jax.Array, gather: np.ndarray, catch_up: StepInputs,
                chain: ChainInputs | None) -> np.ndarray:
        """[S, k] int32: each row's k greedy proposals (rows that do not propose: garbage); waits for them."""
        return _fetch(self.dispatch(aux, gather, catch_up, chain)).T

    def precompile(self, aux: jax.ShapeDtypeStruct, gather: np.ndarray, catch_up: StepInputs,
                   chain: ChainInputs | None) -> None:
        args = self._args(aux, gather, catch_up, chain)
        key = ("eagle3", input_signature(args[3:]))
        if key not in self._executables:
            self._executables[key] = self._load_or_compile(key, self._propose, args, args, (0, 0))

    @property
    def executables(self) -> list:
        return list(self._executables.values())

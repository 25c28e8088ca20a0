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

import functools
import json
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vllm_jax.config import EngineConfig
from vllm_jax.model.aux_hidden import check_aux_layers, eagle3_default_layers
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.pallas_kernels.precision import model_matmuls
from vllm_jax.sharding import kv_cache_partition_spec
from vllm_jax.spec_decode.device.draft_chain import ChainInputs, empty_chain
from vllm_jax.spec_decode.device.eagle3_head import draft_to_target_ids
from vllm_jax.spec_decode.device.eagle3_spec import Eagle3Spec
from vllm_jax.spec_decode.device.speculator_step import DraftCacheLayout, SpeculatorStep
from vllm_jax.worker.kv_cache import KVCacheShape, bytes_per_block
from vllm_jax.worker.programs import LoadOrCompile, fetch_to_host, input_signature
from vllm_jax.worker.warmup import WarmupContext, WarmupPlan


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


class EagleStep(SpeculatorStep):
    """The EAGLE-3 head's one program, catch-up then chain, over its one-layer KV cache (see the module
    docstring)."""

    def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, kv_cache: jax.Array, num_speculative_tokens: int,
                 embed_tokens: jax.Array | None, load_or_compile: LoadOrCompile,
                 on_trace: Callable[[], None] = lambda: None):
        """`embed_tokens`: the target's embedding, for a head without its own (None: it has one)."""
        super().__init__(graphdef, params, kv_cache, num_speculative_tokens, load_or_compile, on_trace)
        self.embed_tokens = embed_tokens
        self._propose = jax.jit(self._propose_impl, donate_argnums=(1,),
                                out_shardings=(kv_cache.sharding, self.replicated))

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
        return (self.params, self.kv_cache, self.embed_tokens, aux) + self.to_device((gather, catch_up, chain))

    def dispatch(self, aux: jax.Array, gather: np.ndarray, catch_up: StepInputs,
                 chain: ChainInputs | None) -> jax.Array:
        """Run the catch-up and chain (not waited for): [k, S] proposals, replicated."""
        args = self._args(aux, gather, catch_up, chain)
        program = self.program(("eagle3", input_signature(args[3:])), self._propose)
        self.kv_cache, proposed = program(*args)
        return proposed

    def propose(self, aux: jax.Array, gather: np.ndarray, catch_up: StepInputs,
                chain: ChainInputs | None) -> np.ndarray:
        """[S, k] int32: each row's k greedy proposals (rows that do not propose: garbage); waits for them."""
        return fetch_to_host(self.dispatch(aux, gather, catch_up, chain)).T

    # --- warm-up (worker/warmup.py, WarmupPart) ---
    def bucket_plan(self, manager: WarmupContext, num_tokens: int, num_seqs: int) -> WarmupPlan:
        return [(f"draft eagle3 T={num_tokens} S={num_seqs}",
                 functools.partial(self._precompile_bucket, manager, num_tokens, num_seqs))]

    def final_plan(self, manager: WarmupContext) -> WarmupPlan:
        return []

    def _precompile_bucket(self, manager: WarmupContext, num_tokens: int, num_seqs: int) -> None:
        """After the bucket's forward, whose [T, 3 * hidden] aux states the head reads."""
        inputs = manager.empty_inputs(num_tokens, num_seqs)
        aux = manager.device.forward_outputs(inputs)[2]
        chain = None
        if self.k > 1:
            s = manager.shapes
            chain = empty_chain(self.k - 1, num_seqs, num_seqs, block_size=s.block_size,
                                max_blocks_per_seq=s.max_blocks_per_seq)
        self.precompile(aux, np.zeros(num_tokens, np.int32), inputs, chain)

    def precompile(self, aux: jax.ShapeDtypeStruct, gather: np.ndarray, catch_up: StepInputs,
                   chain: ChainInputs | None) -> None:
        args = self._args(aux, gather, catch_up, chain)
        self.make_ready(("eagle3", input_signature(args[3:])), self._propose, args, args, (0, 0))

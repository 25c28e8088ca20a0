"""The draft model on the device: its params, its own KV cache, and its two programs.

`draft_model` speculation (docs/architecture/08-sampling.md, "Speculative decoding"): the draft's cache has the draft's
layer shapes but the target's block count, and every request uses the same block ids in both, so the block manager
allocates and frees the draft's KV with the target's and nothing else tracks it.

- catch-up: the draft runs the target's own step inputs (same tokens, positions and slots), writing its KV for
  every token the target computed; launched right after the target's step, it needs nothing from it.
- chain: k one-token steps from each proposing request's newest token, each feeding the previous step's greedy
  token (spec_decode/device/draft_chain.py); one program, a scan over the k steps.

In a multi-host run every process runs both programs on the same inputs (process 0 broadcasts the chain's, the
catch-up's are the step's own); the proposals come back replicated, so process 0 reads its own copy.

Proposals are the draft's argmax, as vLLM's proposers make them: q is one-hot, so the sampler's acceptance rule
min(1, p/q) is p(x) and the residual (p - q)+ is p without x (sample/sampler.py, `verify_proposals`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vllm_jax.config import EngineConfig
from vllm_jax.model.spec import DecoderSpec
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.pallas_kernels.precision import model_matmuls
from vllm_jax.sharding import kv_cache_partition_spec
from vllm_jax.spec_decode.device.draft_chain import ChainInputs, empty_chain
from vllm_jax.spec_decode.device.speculator_step import DraftCacheLayout, SpeculatorStep
from vllm_jax.worker.kv_cache import cache_shape, lane_dense_cache, spec_bytes_per_block
from vllm_jax.worker.programs import LoadOrCompile, fetch_to_host, input_signature
from vllm_jax.worker.warmup import WarmupContext, WarmupPlan


def draft_cache_layout(config: EngineConfig, spec: DecoderSpec, mesh: Mesh) -> DraftCacheLayout:
    """The draft cache's layout on the target's mesh, partitioned by the draft's own KV heads."""
    tp = config.parallel_config.tensor_parallel_size
    lane_dense = lane_dense_cache(config, spec)
    kv_spec = kv_cache_partition_spec(spec, tp, lane_dense)
    num_shards = tp if kv_spec != PartitionSpec() else 1
    per_block = spec_bytes_per_block(spec, config.cache_config.block_size,
                                     config.model_config.kv_cache_dtype, lane_dense) // num_shards
    return DraftCacheLayout(cache_shape(config, spec, 0), NamedSharding(mesh, kv_spec), per_block)


class DraftStep(SpeculatorStep):
    """The draft model's catch-up and chain programs over its own KV cache (see the module docstring)."""

    def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, kv_cache: jax.Array, num_speculative_tokens: int,
                 load_or_compile: LoadOrCompile, on_trace: Callable[[], None] = lambda: None):
        super().__init__(graphdef, params, kv_cache, num_speculative_tokens, load_or_compile, on_trace)
        self.chain_buckets: list[tuple[int, int]] = []  # (tokens, sequences) of the chain programs warm-up makes
        self._catch_up = jax.jit(self._catch_up_impl, donate_argnums=(1,))
        self._chain = jax.jit(self._chain_impl, donate_argnums=(1,),
                              out_shardings=(kv_cache.sharding, self.replicated))

    def _catch_up_impl(self, params, kv_cache, inputs: StepInputs):
        self.on_trace()
        with model_matmuls(params):  # pallas_kernels/precision.py
            kv_cache, _, _ = nnx.merge(self.graphdef, params).hidden_states(kv_cache, inputs)
        return kv_cache

    def _chain_impl(self, params, kv_cache, chain: ChainInputs):
        self.on_trace()
        model = nnx.merge(self.graphdef, params)
        num_tokens, num_seqs = chain.first_token_ids.shape[0], chain.seq_lens.shape[1]
        shared = min(num_tokens, num_seqs)  # a row's token and its logits row have the same index

        def one(carry, xs):
            kv_cache, token_ids = carry
            positions, slot_mapping, seq_lens = xs
            inputs = StepInputs(token_ids, positions, slot_mapping, chain.block_tables, seq_lens,
                                chain.query_start_loc, chain.num_seqs, chain.logits_indices)
            kv_cache, logits = model(kv_cache, inputs)
            proposed = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [S]
            return (kv_cache, token_ids.at[:shared].set(proposed[:shared])), proposed

        xs = (chain.positions, chain.slot_mapping, chain.seq_lens)
        with model_matmuls(params):  # pallas_kernels/precision.py
            (kv_cache, _), proposed = jax.lax.scan(one, (kv_cache, chain.first_token_ids), xs)
        return kv_cache, proposed  # [k, S]

    def catch_up(self, inputs: StepInputs) -> None:
        """Write the draft's KV for the tokens of the target's step (dispatched, not waited for)."""
        program = self.program(("draft_catch_up", input_signature(inputs)), self._catch_up)
        self.kv_cache = program(self.params, self.kv_cache, self.to_device(inputs))

    def dispatch(self, chain: ChainInputs) -> jax.Array:
        """Run the chain (not waited for): [k, S] proposals, replicated."""
        program = self.program(("draft_chain", input_signature(chain)), self._chain)
        self.kv_cache, proposed = program(self.params, self.kv_cache, self.to_device(chain))
        return proposed

    def propose(self, chain: ChainInputs) -> np.ndarray:
        """[S, k] int32: each row's k greedy proposals (waits for the device)."""
        return fetch_to_host(self.dispatch(chain)).T

    # --- warm-up (worker/warmup.py, WarmupPart) ---
    def bucket_plan(self, manager: WarmupContext, num_tokens: int, num_seqs: int) -> WarmupPlan:
        return [(f"draft catch-up T={num_tokens} S={num_seqs}",
                 functools.partial(self._precompile_catch_up_bucket, manager, num_tokens, num_seqs))]

    def _precompile_catch_up_bucket(self, manager: WarmupContext, num_tokens: int, num_seqs: int) -> None:
        self.precompile_catch_up(manager.empty_inputs(num_tokens, num_seqs))

    def final_plan(self, manager: WarmupContext) -> WarmupPlan:
        return [(f"draft chain T={num_tokens} S={num_seqs}",
                 functools.partial(self._precompile_chain_bucket, manager, num_tokens, num_seqs))
                for num_tokens, num_seqs in self.chain_buckets]

    def _precompile_chain_bucket(self, manager: WarmupContext, num_tokens: int, num_seqs: int) -> None:
        s = manager.shapes
        self.precompile_chain(empty_chain(self.k, num_tokens, num_seqs, block_size=s.block_size,
                                          max_blocks_per_seq=s.max_blocks_per_seq))

    def precompile_catch_up(self, inputs: StepInputs) -> None:
        args = (self.params, self.kv_cache, self.to_device(inputs))
        self.make_ready(("draft_catch_up", input_signature(inputs)), self._catch_up, args, args, 0)

    def precompile_chain(self, chain: ChainInputs) -> None:
        args = (self.params, self.kv_cache, self.to_device(chain))
        self.make_ready(("draft_chain", input_signature(chain)), self._chain, args, args, (0, 0))

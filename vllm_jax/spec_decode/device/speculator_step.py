"""What the draft model's step and the EAGLE-3 head's step share: the speculator's params, its own KV cache (the
target's block count and block ids, its own layer shapes), k, and the program base they compile through
(docs/architecture/08-sampling.md, "Speculative decoding")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
from flax import nnx
from jax.sharding import NamedSharding

from vllm_jax.worker.kv_cache import KVCacheShape
from vllm_jax.worker.programs import CompiledPrograms, LoadOrCompile


@dataclass(frozen=True)
class DraftCacheLayout:
    """A speculator's KV cache on the target's mesh."""

    shape: KVCacheShape  # its num_blocks is the target's, known once the budget is split
    sharding: NamedSharding
    bytes_per_block: int  # on one device


class SpeculatorStep(CompiledPrograms):
    """A speculator's programs over its params and its donated KV cache. They compile through the engine step's
    `load_or_compile` (its compilation cache, and compile-check's recorder), and count their traces with the
    engine's."""

    def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, kv_cache: jax.Array, num_speculative_tokens: int,
                 load_or_compile: LoadOrCompile, on_trace: Callable[[], None] = lambda: None):
        super().__init__(kv_cache.sharding.mesh, on_trace=on_trace, compile_with=load_or_compile)
        self.graphdef, self.params, self.kv_cache = graphdef, params, kv_cache
        self.k = num_speculative_tokens

    def device_arrays(self) -> list:
        """What warm-up waits for: its KV cache (allocated asynchronously)."""
        return [self.kv_cache]

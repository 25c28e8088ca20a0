"""The engine's cumulative counters turned into what the stat loggers take: per-iteration increments and snapshots."""

from __future__ import annotations

from vllm_jax.engine.llm_engine import LLMEngine
from vllm_jax.metrics.stats import EngineStats, IterationStats


class EngineCounters:
    def __init__(self, engine: LLMEngine):
        self._engine = engine
        self._last = (0, 0, 0)
        self.num_steps = 0

    def take_deltas(self, it: IterationStats) -> None:
        """Add to `it` what the prefix cache and the preemptions counted since the last call."""
        kv, sched = self._engine.kv_cache_manager, self._engine.scheduler
        now = (kv.prefix_cache_queries, kv.prefix_cache_hits, sched.num_preemptions_total)
        it.prefix_cache_queries += now[0] - self._last[0]
        it.prefix_cache_hits += now[1] - self._last[1]
        it.num_preemptions += now[2] - self._last[2]
        self._last = now

    def snapshot(self) -> EngineStats:
        kv, sched = self._engine.kv_cache_manager, self._engine.scheduler
        return EngineStats(
            num_requests_running=sched.num_running, num_requests_waiting=sched.num_waiting,
            kv_cache_usage=float(kv.usage), prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits, num_preemptions=sched.num_preemptions_total,
            num_blocks_free=kv.num_free_blocks, num_blocks_total=kv.num_blocks, num_steps=self.num_steps)

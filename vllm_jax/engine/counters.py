"""The engine's cumulative counters turned into what the stat loggers take: per-iteration increments and snapshots."""

from __future__ import annotations

from vllm_jax.engine.llm_engine import LLMEngine
from vllm_jax.metrics.stats import EngineStats, IterationStats, SpecDecodingStats


class EngineCounters:
    def __init__(self, engine: LLMEngine):
        self._engine = engine
        self._last = (0, 0, 0)
        spec = engine.config.speculative_config
        self._num_spec_tokens = None if spec is None else spec.num_speculative_tokens
        # the scheduler's speculative-decoding counts at the last call: drafts, draft tokens, accepted, per position
        self._last_spec = (0, 0, 0, [0] * (self._num_spec_tokens or 0))
        self.num_steps = 0

    def take_deltas(self, it: IterationStats) -> None:
        """Add to `it` what the prefix cache, the preemptions and speculative decoding counted since the last call."""
        kv, sched = self._engine.kv_cache_manager, self._engine.scheduler
        now = (kv.prefix_cache_queries, kv.prefix_cache_hits, sched.num_preemptions_total)
        it.prefix_cache_queries += now[0] - self._last[0]
        it.prefix_cache_hits += now[1] - self._last[1]
        it.num_preemptions += now[2] - self._last[2]
        self._last = now
        if self._num_spec_tokens is not None:
            self._take_spec_deltas(it)

    def _take_spec_deltas(self, it: IterationStats) -> None:
        k, counts = self._num_spec_tokens, self._engine.scheduler.spec_decode_counts
        # the scheduler's per-position list grows with the longest draft seen so far: pad it to k
        per_pos = list(counts.num_accepted_tokens_per_pos[:k])
        per_pos += [0] * (k - len(per_pos))
        now = (counts.num_drafts, counts.num_draft_tokens, counts.num_accepted_tokens, per_pos)
        last = self._last_spec
        if it.spec_decoding is None:
            it.spec_decoding = SpecDecodingStats.zeros(k)
        spec = it.spec_decoding
        spec.num_drafts += now[0] - last[0]
        spec.num_draft_tokens += now[1] - last[1]
        spec.num_accepted_tokens += now[2] - last[2]
        for i in range(k):
            spec.num_accepted_tokens_per_pos[i] += per_pos[i] - last[3][i]
        self._last_spec = now

    def snapshot(self) -> EngineStats:
        kv, sched = self._engine.kv_cache_manager, self._engine.scheduler
        return EngineStats(
            num_requests_running=sched.num_running, num_requests_waiting=sched.num_waiting,
            kv_cache_usage=float(kv.usage), prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits, num_preemptions=sched.num_preemptions_total,
            num_blocks_free=kv.num_free_blocks, num_blocks_total=kv.num_blocks, num_steps=self.num_steps)

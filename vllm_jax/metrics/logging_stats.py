"""vLLM's periodic stats log line: throughput, queues, KV-cache usage and prefix-cache hit rate, per engine.

`LoggingStatLogger` is a StatLogger (stat_logger.py). It adds up prompt and generation tokens (and speculative
decoding's counts) from each IterationStats and, once `interval_s` has passed since an engine's last line, logs
at INFO, in vLLM's words:

    Engine 000: Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 95.0 tokens/s, Running: 8 reqs,
    Waiting: 0 reqs, GPU KV cache usage: 12.5%, Prefix cache hit rate: 40.0%

and, with speculative decoding on and drafts verified in the interval, a second line "SpecDecoding metrics: Mean
acceptance length: ..." (mean acceptance length = 1 + accepted / drafts: the bonus token counts, as in vLLM).

Throughputs are tokens over the seconds since the engine's previous line. Queue lengths and KV usage come from
the engine's latest snapshot; the prefix-cache hit rate is the engine's lifetime one (vLLM's covers its latest
1000 requests). As in vLLM, an interval without tokens that follows another one without tokens is logged at DEBUG
only, so an idle server stays quiet at INFO (the first idle interval after work still shows the drop to zero).
The line is written from `record`, on the engine's thread: an engine that sleeps (no requests) logs nothing until
it is woken. `interval_s` defaults to vLLM's `VLLM_LOG_STATS_INTERVAL` (seconds, 10 when unset or not positive).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm_jax.metrics.stats import EngineStats, IterationStats

logger = logging.getLogger("vllm_jax.metrics")

INTERVAL_ENV = "VLLM_LOG_STATS_INTERVAL"
DEFAULT_INTERVAL_S = 10.0  # vLLM's default


def interval_from_env() -> float:
    """`VLLM_LOG_STATS_INTERVAL` in seconds; vLLM's 10 when unset or not positive. Not a number: a ValueError."""
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV} must be a number of seconds; got {raw!r}") from None
    return value if value > 0 else DEFAULT_INTERVAL_S


@dataclass
class _EngineInterval:
    """One engine's counts since its last line, and the latest snapshot."""

    started: float
    snapshot: EngineStats = field(default_factory=EngineStats)
    was_busy: bool = False  # the previous interval had tokens
    prompt_tokens: int = 0
    generation_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def add(self, it: IterationStats) -> None:
        self.prompt_tokens += it.num_prompt_tokens
        self.generation_tokens += it.num_generation_tokens
        spec = it.spec_decoding
        if spec is not None:
            self.drafts += spec.num_drafts
            self.draft_tokens += spec.num_draft_tokens
            self.accepted += spec.num_accepted_tokens
            per_pos = spec.num_accepted_tokens_per_pos
            self.accepted_per_pos += [0] * (len(per_pos) - len(self.accepted_per_pos))
            for i, n in enumerate(per_pos):
                self.accepted_per_pos[i] += n

    def restart(self, now: float, busy: bool) -> None:
        self.started, self.was_busy = now, busy
        self.prompt_tokens = self.generation_tokens = self.drafts = self.draft_tokens = self.accepted = 0
        self.accepted_per_pos = [0] * len(self.accepted_per_pos)


class LoggingStatLogger:
    """vLLM's "Engine 000: Avg prompt throughput ..." line every `interval_s` seconds, for each engine."""

    def __init__(self, interval_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_from_env() if interval_s is None else interval_s
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be positive; got {self.interval_s}")
        self._clock = clock
        self._engines: dict[int, _EngineInterval] = {}
        self._lock = threading.Lock()  # replicas record from their own threads; one engine's calls never overlap

    def record(self, engine_stats: EngineStats, iteration_stats: IterationStats | None = None,
               engine_index: int = 0) -> None:
        now = self._clock()
        state = self._engines.get(engine_index)
        if state is None:  # the engine's first call starts its first interval
            with self._lock:
                state = self._engines.setdefault(engine_index, _EngineInterval(started=now))
        state.snapshot = engine_stats
        if iteration_stats is not None:
            state.add(iteration_stats)
        if now - state.started >= self.interval_s:
            self._log(engine_index, state, now)

    def _log(self, engine_index: int, s: _EngineInterval, now: float) -> None:
        elapsed = now - s.started
        busy = bool(s.prompt_tokens or s.generation_tokens)
        level = logging.INFO if busy or s.was_busy else logging.DEBUG
        snap = s.snapshot
        hit_rate = snap.prefix_cache_hits / snap.prefix_cache_queries if snap.prefix_cache_queries else 0.0
        logger.log(level, "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f "
                   "tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit "
                   "rate: %.1f%%", engine_index, s.prompt_tokens / elapsed, s.generation_tokens / elapsed,
                   snap.num_requests_running, snap.num_requests_waiting, snap.kv_cache_usage * 100, hit_rate * 100)
        if s.drafts:
            rates = ", ".join(f"{n / s.drafts:.3f}" for n in s.accepted_per_pos)
            acceptance = s.accepted / s.draft_tokens * 100 if s.draft_tokens else float("nan")
            logger.log(level, "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f "
                       "tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
                       "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%",
                       1 + s.accepted / s.drafts, s.accepted / elapsed, s.draft_tokens / elapsed, s.accepted,
                       s.draft_tokens, rates, acceptance)
        s.restart(now, busy)

"""The stat-logger protocol: how an engine hands its statistics to whoever watches them.

An engine is given its loggers when it is built, as vLLM's `AsyncLLM` takes `stat_loggers`, and knows nothing
of what they do with the numbers (docs/architecture/01-overview.md, "Layout"). The Prometheus exporter (prometheus.py)
is one, vLLM's periodic log line (logging_stats.py) another; whoever starts the engine (the server's launcher) creates
them and decides where the Prometheus registry is served.
"""

from __future__ import annotations

from typing import Protocol

from vllm_jax.metrics.stats import EngineStats, IterationStats


class StatLogger(Protocol):
    def record(self, engine_stats: EngineStats, iteration_stats: IterationStats | None = None,
               engine_index: int = 0) -> None:
        """Take the engine's latest snapshot and, after a loop iteration, what that iteration did.

        Called with `iteration_stats=None` when only the snapshot changed (a request submitted, the engine dead).
        Calls for one engine never overlap and come in the order the changes happened: the engine holds its
        request lock meanwhile, so return quickly. `engine_index` tells data-parallel replicas apart.
        """

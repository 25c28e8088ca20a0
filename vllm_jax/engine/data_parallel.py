"""Data parallelism: N engine replicas, each with its own scheduler, KV cache and slice of devices, behind one
AsyncLLM-shaped front. Each request goes to the least-loaded replica (fewest requests in flight, ties to the
lower rank). Every replica feeds the same stat loggers under its rank as engine index, so a logger can add the
replicas up (the Prometheus one does: counters add up, gauges sum over replicas).

The RL loop's calls (sleep, wake_up, update_weights, reset_prefix_cache, pause / resume) go to every replica, as
vLLM's data-parallel front sends them to every engine core (docs/architecture/02-engine.md,
"Pause and resume").
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from vllm_jax.config import EngineArgs, EngineConfig, initialize_distributed
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.engine.llm_engine import LLMEngine
from vllm_jax.metrics.stat_logger import StatLogger
from vllm_jax.metrics.stats import EngineStats, combine_engine_stats
from vllm_jax.outputs import RequestOutput
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.sharding import make_mesh


class DataParallelAsyncLLM:
    def __init__(self, config: EngineConfig, *, max_num_queued_requests: int | None = None,
                 stat_loggers: Sequence[StatLogger] = (), warmup: bool = True):
        pc = config.parallel_config
        mesh = make_mesh(pc.tensor_parallel_size, pc.data_parallel_size)  # checks the device count
        self._config = config
        self.replicas = [
            AsyncLLM(config, max_num_queued_requests=max_num_queued_requests, stat_loggers=stat_loggers,
                     engine_index=rank, engine_factory=lambda cfg, devices=list(mesh.devices[rank]): LLMEngine(
                         cfg, warmup=warmup, show_progress=False, devices=devices))
            for rank in range(pc.data_parallel_size)]
        self._in_flight = [0] * len(self.replicas)
        self._served = [0] * len(self.replicas)
        self._owner: dict[str, int] = {}

    @classmethod
    def from_engine_args(cls, args: EngineArgs, **kwargs: Any) -> DataParallelAsyncLLM:
        initialize_distributed(args)
        return cls(args.create_config(), **kwargs)

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()

    def wait_until_ready(self, timeout: float | None = None) -> None:
        for replica in self.replicas:
            replica.wait_until_ready(timeout)

    @property
    def ready(self) -> bool:
        return all(r.ready for r in self.replicas)

    @property
    def shutting_down(self) -> bool:
        return any(r.shutting_down for r in self.replicas)

    @property
    def dead(self) -> bool:
        return any(r.dead for r in self.replicas)

    @property
    def error(self) -> BaseException | None:
        return next((r.error for r in self.replicas if r.error is not None), None)

    @property
    def tokenizer(self) -> Any:
        return self.replicas[0].tokenizer

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def vocab_size(self) -> int:
        return self.replicas[0].vocab_size

    @property
    def grammar_compiler(self) -> Any:
        """Replica 0's: every replica has the same tokenizer and vocabulary, so a grammar compiled there serves
        any of them."""
        return self.replicas[0].grammar_compiler

    @property
    def requests_per_replica(self) -> list[int]:
        """Requests each replica has been given so far (for tests and logs)."""
        return list(self._served)

    def get_stats(self) -> EngineStats:
        return combine_engine_stats([r.get_stats() for r in self.replicas])

    async def generate(self, prompt, sampling_params: SamplingParams, request_id: str, *, priority: int = 0,
                       cache_salt: str | None = None, lora_request=None) -> AsyncIterator[RequestOutput]:
        rank = min(range(len(self.replicas)), key=lambda i: (self._in_flight[i], i))
        self._in_flight[rank] += 1
        self._served[rank] += 1
        self._owner[request_id] = rank
        try:
            async for output in self.replicas[rank].generate(prompt, sampling_params, request_id,
                                                             priority=priority, cache_salt=cache_salt,
                                                             lora_request=lora_request):
                yield output
        finally:
            self._in_flight[rank] -= 1
            self._owner.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        rank = self._owner.get(request_id)
        if rank is not None:
            await self.replicas[rank].abort(request_id)

    async def shutdown(self, timeout: float = 0.0) -> None:
        await asyncio.gather(*(r.shutdown(timeout) for r in self.replicas))

    # ---- RL loops: every call goes to every replica ----------------------------------------------------------

    async def _on_every_replica(self, what: str, call: Callable[[AsyncLLM], Awaitable[Any]]) -> list[Any]:
        """call(replica) on all replicas at once; their values in rank order. When some fail, the error names each
        failed replica and its reason and says which replicas did it: those are left in the new state (asleep,
        updated, paused), the failed ones in the old, and the caller retries or undoes it (waking an engine that
        is awake, or pausing a paused one, is harmless)."""
        results = await asyncio.gather(*(call(r) for r in self.replicas), return_exceptions=True)
        failed = [(rank, r) for rank, r in enumerate(results) if isinstance(r, BaseException)]
        if not failed:
            return results
        reasons = "; ".join(f"replica {rank}: {exc}" for rank, exc in failed)
        done = [rank for rank in range(len(results)) if rank not in dict(failed)]
        state = f"replica(s) {done} did {what}" if done else "no replica changed"
        error = failed[0][1]
        kind = ValueError if all(isinstance(e, ValueError) for _, e in failed) else RuntimeError
        raise kind(f"{what} failed on {len(failed)} of {len(results)} data-parallel replicas ({reasons}); "
                   f"{state}") from error

    async def sleep(self, level: int = 1) -> None:
        await self._on_every_replica("sleep", lambda r: r.sleep(level))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self._on_every_replica("wake_up", lambda r: r.wake_up(tags))

    async def is_sleeping(self) -> bool:
        """True only when every replica sleeps."""
        return all(await self._on_every_replica("is_sleeping", lambda r: r.is_sleeping()))

    async def update_weights(self, weights: Any) -> int:
        """Every replica loads the same weights (a checkpoint path, or pairs read once and given to each)."""
        if not isinstance(weights, (str, os.PathLike)):
            weights = list(weights)  # an iterator would be spent by the first replica
        return (await self._on_every_replica("update_weights", lambda r: r.update_weights(weights)))[0]

    async def reset_prefix_cache(self) -> bool:
        return all(await self._on_every_replica("reset_prefix_cache", lambda r: r.reset_prefix_cache()))

    async def pause_generation(self, mode: str = "abort") -> None:
        await self._on_every_replica("pause_generation", lambda r: r.pause_generation(mode))

    async def resume_generation(self) -> None:
        await self._on_every_replica("resume_generation", lambda r: r.resume_generation())

    async def is_paused(self) -> bool:
        """True only when every replica is paused."""
        return all(await self._on_every_replica("is_paused", lambda r: r.is_paused()))

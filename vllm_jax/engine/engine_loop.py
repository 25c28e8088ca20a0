"""AsyncLLM's engine thread: it builds the LLMEngine (load + warm-up), then applies commands and steps.

It is the only thread that touches the engine, so the engine needs no locks. With nothing to do it sleeps on
the registry's condition variable. Each loop iteration takes the inbox (adds and aborts), applies it, runs at most
one step, and publishes what happened at its end, all at once: ids released and counts, stats, then the outputs.

Failure model (docs/architecture/10-faults.md, "Fault policy"): a request-level error (bad prompt or params, too long)
fails that request only, with a ValueError on its first iteration. Any exception inside a step (or the test hook
`fault_hook`) leaves the device state unknown: the engine is marked dead and every request in flight fails.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_jax.config import EngineConfig
from vllm_jax.engine.counters import EngineCounters
from vllm_jax.engine.engine_calls import PauseState
from vllm_jax.engine.errors import EngineShutdownError
from vllm_jax.engine.llm_engine import LLMEngine, StepRecord
from vllm_jax.engine.request_registry import RequestRegistry
from vllm_jax.engine.request_stream import Command, Delivery, RequestStream, deliver
from vllm_jax.metrics.stats import IterationStats
from vllm_jax.model_loader.tokenizer import load_tokenizer
from vllm_jax.outputs import RequestOutput

logger = logging.getLogger(__name__)


@dataclass
class IterationResult:
    """What one loop iteration hands back to the other threads, all at once at its end."""

    stats: IterationStats = field(default_factory=IterationStats)
    scheduled: list[RequestStream] = field(default_factory=list)
    ended: list[RequestStream] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)


class EngineLoop:
    def __init__(self, config: EngineConfig, registry: RequestRegistry,
                 engine_factory: Callable[[EngineConfig], LLMEngine]):
        self._config, self._registry, self._engine_factory = config, registry, engine_factory
        # Test hook: called on the engine thread at the start of every step; raising in it kills the engine.
        self.fault_hook: Callable[[], None] | None = None
        self.engine: LLMEngine | None = None
        self.tokenizer: Any = None  # the event loop's own (chat templates, /tokenize), loaded before the weights
        self.running = False  # the step loop is running
        self.ready = threading.Event()  # set once start-up ended, well or not
        # Engine thread only:
        self._active: dict[str, RequestStream] = {}  # request id -> stream, for requests the engine holds
        self._by_child: dict[str, RequestStream] = {}  # scheduler (child) id -> stream
        self.pause_state = PauseState()  # pause_generation / resume_generation (engine/engine_calls.py)

    def run(self) -> None:
        """The thread's target: start up, then loop until stopped or dead."""
        started = self._start_up()
        if started is None:
            return
        engine, counters = started
        try:
            self._loop(engine, counters)
        except BaseException as exc:
            logger.exception("engine loop died")
            self._die(exc)
            return
        finally:
            self.running = False
        leftover = self._registry.drop_all()
        self._registry.fail(leftover, EngineShutdownError("the engine shut down"))

    def _start_up(self) -> tuple[LLMEngine, EngineCounters] | None:
        try:
            self.tokenizer = load_tokenizer(self._config.model_config)
            engine = self._engine_factory(self._config)
            counters = EngineCounters(engine)
        except BaseException as exc:
            logger.exception("engine start-up failed")
            self._die(exc)
            return None
        self.engine = engine
        self._registry.engine_started(counters.snapshot())
        self.running = True
        self.ready.set()
        return engine, counters

    def _die(self, exc: BaseException) -> None:
        """Fail every request in flight or queued; later generate() calls fail at once."""
        streams = self._registry.die(exc)
        self.ready.set()
        self._registry.fail(streams, None)

    def _loop(self, engine: LLMEngine, counters: EngineCounters) -> None:
        stuck = False
        while True:
            commands, stop = self._registry.next_commands(lambda: self._may_step(engine), stuck)
            result = IterationResult()
            self._apply(engine, commands, result)
            if commands:
                self._registry.set_stats(counters.snapshot())  # adds and aborts show before the (maybe long) step
            stuck = False
            if not stop and self._may_step(engine):
                stuck = self._step(engine, counters, result)
            self.pause_state.after_iteration(engine)
            self._finish_iteration(counters, result)
            if stop:
                return

    # ---- commands -------------------------------------------------------------------------------------------

    def _may_step(self, engine: LLMEngine) -> bool:
        return engine.has_work() and not self.pause_state.paused

    def _apply(self, engine: LLMEngine, commands: list[Command], result: IterationResult) -> None:
        held = self.pause_state.held
        for cmd in commands:
            if cmd.kind == "call":
                cmd.call(self, engine, result)
            elif cmd.kind == "add" and self.pause_state.holds_new_requests:
                held.append(cmd)  # starts at resume_generation
            elif cmd.kind == "add":
                self._add(engine, cmd.stream, result)
            elif self._active.get(cmd.stream.request_id) is cmd.stream:
                self._abort(engine, cmd, result)
            elif any(h.stream is cmd.stream for h in held):  # aborted before it started
                held[:] = [h for h in held if h.stream is not cmd.stream]
                if cmd.notify:
                    result.deliveries.append((cmd.stream, _rejection(cmd.stream.request_id, ValueError(
                        "aborted while generation was paused"))))
                self._end(cmd.stream, result)

    # engine/engine_calls.py's hooks
    apply_commands = _apply

    def abort_all(self, engine: LLMEngine, result: IterationResult) -> None:
        """End every request the engine holds (pause_generation(mode="abort")): final outputs, "abort"."""
        for stream in list(self._active.values()):
            self._abort(engine, Command("abort", stream, notify=True), result)

    def _add(self, engine: LLMEngine, stream: RequestStream, result: IterationResult) -> None:
        rid = stream.request_id
        try:
            engine.add_request(rid, stream.prompt, stream.params, arrival_time=stream.arrival_wall,
                               priority=stream.priority, cache_salt=stream.cache_salt,
                               lora_request=stream.lora_request)
        except BaseException as exc:
            if not _fails_only_this_request(exc):
                raise
            result.deliveries.append((stream, _rejection(rid, exc)))  # add_request left nothing behind
            result.ended.append(stream)
            return
        self._active[rid] = stream
        for cid in stream.ids[1:] or [rid]:
            self._by_child[cid] = stream
        stream.timer.num_prompt_tokens = engine.num_prompt_tokens(rid)

    def _abort(self, engine: LLMEngine, cmd: Command, result: IterationResult) -> None:
        finals = engine.abort_request(cmd.stream.request_id)
        cmd.stream.timer.on_finished(time.monotonic(), result.stats)
        self._end(cmd.stream, result)
        if cmd.notify:
            result.deliveries += [(cmd.stream, out) for out in finals]

    def _end(self, stream: RequestStream, result: IterationResult) -> None:
        self._active.pop(stream.request_id, None)
        for cid in stream.ids[1:] or [stream.request_id]:
            self._by_child.pop(cid, None)
        result.ended.append(stream)

    # ---- the step -------------------------------------------------------------------------------------------

    def _step(self, engine: LLMEngine, counters: EngineCounters, result: IterationResult) -> bool:
        """One engine step and its stats; True when it scheduled nothing although requests are unfinished."""
        started = time.monotonic()
        hook = self.fault_hook
        if hook is not None:
            hook()
        outputs = engine.step()
        now = time.monotonic()
        counters.num_steps += 1
        self._time_step(engine.last_step, started, now, result)
        self._route_outputs(outputs, now, result)
        stuck = not engine.last_step.made_progress and not outputs and engine.has_unfinished_requests()
        if stuck:
            logger.warning("engine step scheduled nothing while %d requests are unfinished",
                           engine.get_num_unfinished_requests())
        return stuck

    def _time_step(self, record: StepRecord, started: float, now: float, result: IterationResult) -> None:
        """Feed the request timers: first scheduling, and the tokens each request got from this step."""
        it = result.stats
        it.num_scheduled_tokens += record.num_scheduled_tokens
        for scheduled in record.scheduled:
            for new in scheduled.scheduled_new_reqs:
                stream = self._by_child.get(new.req_id)
                if stream is not None and stream.timer.on_scheduled(started):
                    result.scheduled.append(stream)
        new_tokens: dict[RequestStream, int] = {}
        for core in record.core_outputs:
            stream = self._by_child.get(core.req_id)
            if stream is not None and (core.new_token_ids or core.finish_reason is not None):  # pooled: no tokens
                new_tokens[stream] = new_tokens.get(stream, 0) + len(core.new_token_ids)
        for stream, count in new_tokens.items():
            stream.timer.on_tokens(now, count, it)

    def _route_outputs(self, outputs: list[RequestOutput], now: float, result: IterationResult) -> None:
        for out in outputs:
            stream = self._active.get(out.request_id)
            if stream is None:
                continue
            for completion in out.outputs:
                if completion.finish_reason is not None:
                    stream.timer.finish_reasons[completion.index] = completion.finish_reason
            result.deliveries.append((stream, out))
            if out.finished:
                stream.timer.on_finished(now, result.stats)
                self._end(stream, result)

    def _finish_iteration(self, counters: EngineCounters, result: IterationResult) -> None:
        counters.take_deltas(result.stats)
        self._registry.finish_iteration(counters.snapshot(), result.stats, result.scheduled, result.ended)
        orphans = deliver(result.deliveries)
        if orphans:  # their event loop is gone: nobody will read them, so abort them next iteration
            self._registry.requeue_aborts([s for s in orphans if self._active.get(s.request_id) is s])


def _fails_only_this_request(exc: BaseException) -> bool:
    """Bad input fails its own request, never the engine: any Exception, and a Rust panic inside the tokenizer
    (pyo3 raises `PanicException`, which derives from BaseException); KeyboardInterrupt and the like propagate."""
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


def _rejection(request_id: str, exc: BaseException) -> BaseException:
    """What the caller of a refused request gets: bad input as a ValueError (a TypeError from the tokenizer too);
    anything else as itself, logged."""
    if isinstance(exc, ValueError):
        return exc
    logger.warning("request %s rejected: %s: %s", request_id, type(exc).__name__, exc)
    return ValueError(str(exc)) if isinstance(exc, TypeError) else exc

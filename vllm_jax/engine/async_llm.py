"""AsyncLLM: the serving engine. One background thread owns the LLMEngine; asyncio code talks to it through queues.

Threads and ownership:
- The engine thread builds the LLMEngine (load + warm-up) and then runs the step loop. It is the only thread that
  touches the engine, so the engine needs no locks. With nothing to do it sleeps on a condition variable.
- The event loop never runs engine code. `generate()` / `abort()` append commands to an inbox under a lock that
  the engine thread holds only to swap the inbox out (never during a step), and notify the condition.
- Each request has an asyncio.Queue on the loop that started it; the engine thread fills it through
  `loop.call_soon_threadsafe`, one call per loop per step.

Failure model: a request-level error (bad prompt or params, too long) fails that request only, with a ValueError
on its first iteration. Any exception inside a step (or the test hook `fault_hook`) leaves the device state
unknown: the engine is marked dead, every in-flight request gets EngineDeadError, and so does every later
generate(). Nothing ever waits forever on a dead engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_jax.config import EngineArgs, EngineConfig
from vllm_jax.engine.llm_engine import LLMEngine, PromptType
from vllm_jax.engine.output_processor import child_request_ids
from vllm_jax.metrics.stats import EngineCounters, EngineStats, IterationStats, RequestTimer
from vllm_jax.outputs import CompletionOutput, RequestOutput
from vllm_jax.sampling_params import RequestOutputKind, SamplingParams
from vllm_jax.scheduler.request import RequestStatus
from vllm_jax.metrics.prometheus import EngineMetrics

logger = logging.getLogger(__name__)

_STUCK_BACKOFF_S = 0.05  # wait between steps that schedule nothing while requests are unfinished (a bug guard)


class EngineDeadError(RuntimeError):
    """The engine loop died (or never started); the message names the original error.

    `in_flight` is True when the engine had accepted the request and then died under it (a server failure: HTTP
    500), False when the request was refused because the engine was already dead (unavailable: HTTP 503).
    """

    in_flight: bool = False


class EngineShutdownError(EngineDeadError):
    """The engine is shutting down (or shut down) and accepts no new requests."""


class QueueFullError(RuntimeError):
    """More than `max_num_queued_requests` requests are waiting to be scheduled."""


@dataclass(eq=False)
class _Stream:
    """One request's link between the event loop that awaits it and the engine thread."""

    request_id: str
    ids: list[str]  # the request id, then its child ids when n > 1: all reserved while in flight
    prompt: PromptType
    params: SamplingParams
    priority: int
    cache_salt: str | None
    arrival_wall: float
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    timer: RequestTimer
    # Guarded by AsyncLLM._cv:
    waiting: bool = True  # counted in AsyncLLM._num_waiting (not scheduled yet)
    ended: bool = False  # ids released; the consumer gets nothing more than what is already posted
    # Engine thread only:
    prompt_token_ids: list[int] = field(default_factory=list)
    last_output: RequestOutput | None = None  # CUMULATIVE requests: the text an abort output repeats


@dataclass
class _Command:
    kind: str  # "add" or "abort"
    stream: _Stream
    notify: bool = False  # abort: send the consumer a final output with finish_reason "abort"


@dataclass
class _IterationResult:
    """What one engine-loop iteration hands back to the other threads, all at once at its end."""

    stats: IterationStats = field(default_factory=IterationStats)
    scheduled: list[_Stream] = field(default_factory=list)
    ended: list[_Stream] = field(default_factory=list)
    deliveries: list[tuple[_Stream, RequestOutput | BaseException]] = field(default_factory=list)


class AsyncLLM:
    def __init__(self, config: EngineConfig, *, max_num_queued_requests: int | None = None, log_stats: bool = True,
                 engine_factory: Callable[[EngineConfig], LLMEngine] | None = None):
        if max_num_queued_requests is not None and max_num_queued_requests < 0:
            raise ValueError(f"max_num_queued_requests must be >= 0; got {max_num_queued_requests}")
        self._config = config
        self.max_num_queued_requests = max_num_queued_requests
        self._engine_factory = engine_factory or (lambda cfg: LLMEngine(cfg, show_progress=False))
        # Test hook: called on the engine thread at the start of every step; raising in it kills the engine.
        self.fault_hook: Callable[[], None] | None = None
        self.metrics: EngineMetrics | None = None
        if log_stats:
            self.metrics = EngineMetrics(config.model_config.served_model_name, stats_source=self.get_stats)

        self._cv = threading.Condition()
        # Guarded by _cv:
        self._inbox: list[_Command] = []
        self._ids: dict[str, _Stream] = {}  # every parent and child id in flight
        self._num_waiting = 0
        self._num_pending_adds = 0  # adds in the inbox, not yet seen by the engine
        self._closing = False
        self._stop = False
        self._error: BaseException | None = None

        self._thread: threading.Thread | None = None
        self._ready_event = threading.Event()  # set once start-up ended, well or not
        self._running = False  # the step loop is running
        self._tokenizer: Any = None
        self._stats = EngineStats()
        # Engine thread only:
        self._engine: LLMEngine | None = None
        self._active: dict[str, _Stream] = {}  # request id -> stream, for requests the engine holds
        self._by_child: dict[str, _Stream] = {}  # scheduler (child) id -> stream

    @classmethod
    def from_engine_args(cls, args: EngineArgs, **kwargs: Any) -> AsyncLLM:
        return cls(args.create_config(), **kwargs)

    # ---- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the engine thread (load, warm-up, then the step loop); returns at once."""
        if self._thread is not None:
            raise RuntimeError("AsyncLLM.start() was already called")
        self._thread = threading.Thread(target=self._run, name="vllm-jax-engine", daemon=True)
        self._thread.start()

    def wait_until_ready(self, timeout: float | None = None) -> None:
        """Block until warm-up finished (call it off the event loop); EngineDeadError if start-up failed."""
        if self._thread is None:
            raise RuntimeError("AsyncLLM.start() was not called")
        if not self._ready_event.wait(timeout):
            raise TimeoutError(f"the engine was not ready within {timeout} s")
        if self._error is not None:
            raise self._dead_error()

    @property
    def ready(self) -> bool:
        """Warm-up finished, the loop runs and new requests are accepted (False once shutdown() began)."""
        return self._running and self._error is None and not self._closing

    @property
    def shutting_down(self) -> bool:
        """shutdown() began: in-flight requests may still finish, new ones are refused."""
        return self._closing

    @property
    def dead(self) -> bool:
        """The loop died or start-up failed; `error` holds the exception."""
        return self._error is not None

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def tokenizer(self) -> Any:
        """A tokenizer for the event loop's use (chat templates, /tokenize), separate from the engine thread's.

        None until loaded: it is loaded first thing on the engine thread, before the weights.
        """
        return self._tokenizer

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def vocab_size(self) -> int:
        if self._engine is not None:
            return self._engine.vocab_size
        return int(self._config.model_config.hf_config.vocab_size)

    @property
    def num_compilations(self) -> int:
        """XLA programs the engine's runner has compiled so far (0 before start-up); warm-up compiles every one a
        workload can need, so this stays put while serving."""
        engine = self._engine
        return engine.runner.num_compilations if engine is not None else 0

    def get_stats(self) -> EngineStats:
        """The latest engine snapshot; requests submitted but not yet seen by the engine count as waiting."""
        with self._cv:
            pending = self._num_pending_adds
        stats = self._stats
        if pending:
            stats = dataclasses.replace(stats, num_requests_waiting=stats.num_requests_waiting + pending)
        return stats

    async def shutdown(self, timeout: float = 0.0) -> None:
        """Stop accepting requests, let in-flight ones finish for up to `timeout` s, abort the rest, stop the loop.

        Aborted requests end with a final output whose finish_reason is "abort".
        """
        with self._cv:
            self._closing = True
        deadline = time.monotonic() + max(timeout, 0.0)
        while self._in_flight() and time.monotonic() < deadline and self._loop_alive():
            await asyncio.sleep(0.02)
        with self._cv:
            streams = self._unique_streams()
            for stream in streams:
                self._release_locked(stream)
            if self._running:
                self._inbox.extend(_Command("abort", stream, notify=True) for stream in streams)
                streams = []
            else:
                self._inbox.clear()
                self._num_pending_adds = 0
            self._stop = True
            self._cv.notify_all()
        if streams:  # still starting up: nothing will step, so fail them from here
            self._fail_streams(streams, EngineShutdownError("the engine shut down before it was ready"))
        thread = self._thread
        if thread is not None and thread.is_alive() and self._running:
            await asyncio.get_running_loop().run_in_executor(None, thread.join)

    # ---- requests ---------------------------------------------------------------------------------------------

    async def generate(self, prompt: PromptType, sampling_params: SamplingParams, request_id: str, *,
                       priority: int = 0, cache_salt: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs per `sampling_params.output_kind`.

        Rejections (ValueError for bad input, QueueFullError, EngineDeadError) come from the first iteration,
        before any output. Leaving the iteration early (break + aclose, cancellation) aborts the request.
        """
        stream = self._submit(prompt, sampling_params, request_id, priority, cache_salt)
        done = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                done = item.finished
                yield item
                if done:
                    return
        finally:
            if not done:
                self._cancel(stream)

    async def abort(self, request_id: str) -> None:
        """Abort a request; its generate() ends with a final output whose finish_reason is "abort"."""
        with self._cv:
            stream = self._ids.get(request_id)
            if stream is None or stream.request_id != request_id or stream.ended:
                return
            self._release_locked(stream)
            self._inbox.append(_Command("abort", stream, notify=True))
            self._cv.notify()

    def _submit(self, prompt: PromptType, params: SamplingParams, request_id: str, priority: int,
                cache_salt: str | None) -> _Stream:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if self._thread is None:
            raise RuntimeError("AsyncLLM.start() was not called")
        ids = [request_id] + (child_request_ids(request_id, params.n) if params.n > 1 else [])
        stream = _Stream(request_id=request_id, ids=ids, prompt=prompt, params=params, priority=priority,
                         cache_salt=cache_salt, arrival_wall=time.time(), loop=asyncio.get_running_loop(),
                         queue=asyncio.Queue(), timer=RequestTimer(time.monotonic(), params.n))
        with self._cv:
            if self._error is not None:
                raise self._dead_error()
            if self._closing:
                raise EngineShutdownError("the engine is shutting down and accepts no new requests")
            taken = [i for i in ids if i in self._ids]
            if taken:
                raise ValueError(f"request id {taken[0]!r} is already in use by a request in flight")
            limit = self.max_num_queued_requests
            if limit is not None and self._num_waiting >= limit:
                raise QueueFullError(f"{self._num_waiting} requests are already waiting, the limit "
                                     f"(max_num_queued_requests) is {limit}; retry later")
            for i in ids:
                self._ids[i] = stream
            self._num_waiting += 1
            self._num_pending_adds += 1
            self._inbox.append(_Command("add", stream))
            self._cv.notify()
        return stream

    def _cancel(self, stream: _Stream) -> None:
        """The consumer went away: abort in the engine, no output. Sync: it runs in generator cleanup."""
        with self._cv:
            if stream.ended:
                return
            self._release_locked(stream)
            if self._error is None:
                self._inbox.append(_Command("abort", stream))
                self._cv.notify()

    # ---- shared bookkeeping (callers hold _cv) ----------------------------------------------------------------

    def _release_locked(self, stream: _Stream) -> None:
        if stream.ended:
            return
        stream.ended = True
        for i in stream.ids:
            if self._ids.get(i) is stream:
                del self._ids[i]
        if stream.waiting:
            stream.waiting = False
            self._num_waiting -= 1

    def _unique_streams(self) -> list[_Stream]:
        return list({id(s): s for s in self._ids.values()}.values())

    def _in_flight(self) -> bool:
        with self._cv:
            return bool(self._ids)

    def _loop_alive(self) -> bool:
        return self._error is None and self._thread is not None and self._thread.is_alive()

    def _dead_error(self) -> EngineDeadError:
        what = "the engine loop died" if self._engine is not None else "the engine failed to start"
        err = EngineDeadError(f"{what}: {type(self._error).__name__}: {self._error}")
        err.__cause__ = self._error
        return err

    # ---- the engine thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            from vllm_jax.model_loader.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self._config.model_config)
            engine = self._engine_factory(self._config)
            counters = EngineCounters(engine)
        except BaseException as exc:  # noqa: BLE001 - whatever broke start-up must reach wait_until_ready
            logger.exception("engine start-up failed")
            self._die(exc)
            return
        self._engine = engine
        self._stats = counters.snapshot()
        self._running = True
        self._ready_event.set()
        try:
            self._loop(engine, counters)
        except BaseException as exc:  # noqa: BLE001 - a failed step leaves the device state unknown
            logger.exception("engine loop died")
            self._die(exc)
            return
        finally:
            self._running = False
        with self._cv:  # stopped cleanly; anything still registered cannot run any more
            leftover = self._unique_streams()
            for stream in leftover:
                self._release_locked(stream)
            self._inbox.clear()
        self._fail_streams(leftover, EngineShutdownError("the engine shut down"))

    def _loop(self, engine: LLMEngine, counters: EngineCounters) -> None:
        stuck = False
        while True:
            with self._cv:
                while not self._inbox and not self._stop and (stuck or not self._has_work(engine)):
                    if not self._cv.wait(_STUCK_BACKOFF_S if stuck else None):
                        break  # backoff elapsed: try another step
                commands, self._inbox = self._inbox, []
                self._num_pending_adds = 0
                stop = self._stop
            result = _IterationResult()
            self._apply(engine, commands, result)
            if commands:
                self._stats = counters.snapshot()  # adds and aborts show before the (maybe long) step ends
            stuck = False
            if not stop and self._has_work(engine):
                outputs = self._step(engine, counters, result)
                stuck = result.stats.num_scheduled_tokens == 0 and not outputs and engine.has_unfinished_requests()
                if stuck:
                    logger.warning("engine step scheduled nothing while %d requests are unfinished",
                                   engine.get_num_unfinished_requests())
            self._finish_iteration(counters, result)
            if stop:
                return

    @staticmethod
    def _has_work(engine: LLMEngine) -> bool:
        # Finished-but-unreported ids need one more (empty) step so the runner drops their state.
        return engine.has_unfinished_requests() or engine.scheduler.has_finished_requests()

    def _apply(self, engine: LLMEngine, commands: list[_Command], result: _IterationResult) -> None:
        for cmd in commands:
            if cmd.kind == "add":
                self._add(engine, cmd.stream, result)
            elif self._active.get(cmd.stream.request_id) is cmd.stream:
                engine.abort_request(cmd.stream.request_id)
                cmd.stream.timer.on_finished(time.monotonic(), result.stats)
                self._end(cmd.stream, result)
                if cmd.notify:
                    result.deliveries.append((cmd.stream, self._aborted_output(cmd.stream)))

    def _add(self, engine: LLMEngine, stream: _Stream, result: _IterationResult) -> None:
        rid = stream.request_id
        try:
            engine.add_request(rid, stream.prompt, stream.params, arrival_time=stream.arrival_wall,
                               priority=stream.priority, cache_salt=stream.cache_salt)
        except BaseException as exc:  # noqa: BLE001 - bad input (even a tokenizer panic) fails this request only
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if not isinstance(exc, ValueError):
                logger.warning("request %s rejected: %s: %s", rid, type(exc).__name__, exc)
                # add_request cleans up after ValueError only; make sure nothing of the request stays behind.
                engine.abort_request(rid)
                engine.scheduler.finish_requests(stream.ids, RequestStatus.FINISHED_ABORTED)
            if isinstance(exc, TypeError):
                exc = ValueError(str(exc))
            result.deliveries.append((stream, exc))
            result.ended.append(stream)
            return
        self._active[rid] = stream
        children = stream.ids[1:] or [rid]
        for cid in children:
            self._by_child[cid] = stream
        first = engine.scheduler.requests.get(children[0])
        stream.prompt_token_ids = list(first.prompt_token_ids) if first is not None else []
        stream.timer.num_prompt_tokens = len(stream.prompt_token_ids)

    def _end(self, stream: _Stream, result: _IterationResult) -> None:
        self._active.pop(stream.request_id, None)
        for cid in stream.ids[1:] or [stream.request_id]:
            self._by_child.pop(cid, None)
        result.ended.append(stream)

    def _step(self, engine: LLMEngine, counters: EngineCounters, result: _IterationResult) -> list[RequestOutput]:
        it = result.stats
        started = time.monotonic()
        hook = self.fault_hook
        if hook is not None:
            hook()
        outputs = engine.step()
        now = time.monotonic()
        counters.num_steps += 1
        record = engine.last_step
        it.num_scheduled_tokens += record.scheduled.total_num_scheduled_tokens
        for new in record.scheduled.scheduled_new_reqs:
            stream = self._by_child.get(new.req_id)
            if stream is not None and stream.timer.on_scheduled(started):
                result.scheduled.append(stream)
        new_tokens: dict[_Stream, int] = {}
        for core in record.core_outputs:
            stream = self._by_child.get(core.req_id)
            if stream is not None and core.new_token_ids:
                new_tokens[stream] = new_tokens.get(stream, 0) + len(core.new_token_ids)
        for stream, count in new_tokens.items():
            stream.timer.on_tokens(now, count, it)
        for out in outputs:
            stream = self._active.get(out.request_id)
            if stream is None:
                continue
            for completion in out.outputs:
                if completion.finish_reason is not None:
                    stream.timer.finish_reasons[completion.index] = completion.finish_reason
            if stream.params.output_kind == RequestOutputKind.CUMULATIVE:
                stream.last_output = out
            result.deliveries.append((stream, out))
            if out.finished:
                stream.timer.on_finished(now, it)
                self._end(stream, result)
        return outputs

    def _finish_iteration(self, counters: EngineCounters, result: _IterationResult) -> None:
        """Publish in the order a client can observe: ids and counts, metrics, stats, then the outputs."""
        counters.take_deltas(result.stats)
        with self._cv:
            for stream in result.scheduled:
                if stream.waiting:
                    stream.waiting = False
                    self._num_waiting -= 1
            for stream in result.ended:
                self._release_locked(stream)
        if self.metrics is not None:  # counters before gauges: a scrape never sees "idle" ahead of the counts
            self.metrics.observe(result.stats)
        self._stats = counters.snapshot()
        orphans = self._deliver(result.deliveries)
        if orphans:  # their event loop is gone: nobody will read them, so abort them next iteration
            with self._cv:
                self._inbox.extend(_Command("abort", s) for s in orphans if self._active.get(s.request_id) is s)

    def _aborted_output(self, stream: _Stream) -> RequestOutput:
        """The final output of an aborted request: unfinished completions end with finish_reason "abort"."""
        done = stream.timer.finish_reasons
        last = stream.last_output
        if last is not None:  # CUMULATIVE: repeat the text so far
            outputs = [CompletionOutput(c.index, c.text, c.token_ids, c.cumulative_logprob, c.logprobs,
                                        c.finish_reason or "abort", c.stop_reason) for c in last.outputs]
        else:
            outputs = [CompletionOutput(i, "", [], None, None, "abort") for i in range(stream.params.n)
                       if stream.params.output_kind != RequestOutputKind.DELTA or i not in done]
        prompt = stream.prompt if isinstance(stream.prompt, str) else None
        return RequestOutput(request_id=stream.request_id, prompt=prompt, prompt_token_ids=stream.prompt_token_ids,
                             prompt_logprobs=None, outputs=outputs, finished=True,
                             num_cached_tokens=last.num_cached_tokens if last is not None else 0,
                             metrics={"arrival_time": stream.arrival_wall})

    # ---- delivery and death -----------------------------------------------------------------------------------

    @staticmethod
    def _deliver(deliveries: list[tuple[_Stream, RequestOutput | BaseException]]) -> list[_Stream]:
        """Hand items to their streams' loops, one thread-safe call per loop; returns streams whose loop is closed."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Any]]] = {}
        for stream, item in deliveries:
            by_loop.setdefault(stream.loop, []).append((stream, item))
        orphans: list[_Stream] = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed
                orphans.extend(s for s, _ in items)
        return orphans

    def _die(self, exc: BaseException) -> None:
        """Mark the engine dead and fail every request in flight or queued; later generate() calls fail at once."""
        with self._cv:
            self._error = exc
            streams = self._unique_streams()
            for stream in streams:
                self._release_locked(stream)
            self._inbox.clear()
            self._num_pending_adds = 0
            self._cv.notify_all()
        # Every request was failed: none runs or waits any more (the gauges must not freeze at their last values).
        self._stats = dataclasses.replace(self._stats, num_requests_running=0, num_requests_waiting=0)
        self._ready_event.set()
        self._fail_streams(streams, None)

    def _fail_streams(self, streams: list[_Stream], error: EngineDeadError | None) -> None:
        """Post an error to each stream (a fresh exception each: they are raised in different tasks)."""
        items = []
        for stream in streams:
            err = self._dead_error() if error is None else type(error)(str(error))
            err.in_flight = error is None
            items.append((stream, err))
        self._deliver(items)


def _put_all(items: list[tuple[_Stream, Any]]) -> None:
    for stream, item in items:
        stream.queue.put_nowait(item)

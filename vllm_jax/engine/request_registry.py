"""What AsyncLLM's event-loop side and its engine thread share, behind one lock.

The registry holds every request id in flight (a parent and its child ids), the inbox of commands for the
engine thread, the count of requests not scheduled yet (for max_num_queued_requests), the lifecycle flags and
the latest engine snapshot. The event loop holds the lock only for bookkeeping; the engine thread only to swap
the inbox out and to publish an iteration, never during a step. Every change of the snapshot is handed to the
stat loggers under the lock, so they see the changes in the order they happened.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

from vllm_jax.engine.errors import EngineDeadError, EngineShutdownError, QueueFullError
from vllm_jax.engine.request_stream import Command, RequestStream, deliver
from vllm_jax.metrics.stat_logger import StatLogger
from vllm_jax.metrics.stats import EngineStats, IterationStats

STUCK_BACKOFF_S = 0.05  # wait between steps that schedule nothing while requests are unfinished (a bug guard)


class RequestRegistry:
    def __init__(self, max_num_queued_requests: int | None, stat_loggers: Sequence[StatLogger] = (),
                 engine_index: int = 0):
        self._cv = threading.Condition()
        self.max_num_queued_requests = max_num_queued_requests
        self._loggers = tuple(stat_loggers)
        self._engine_index = engine_index
        # Guarded by _cv:
        self._inbox: list[Command] = []
        self._ids: dict[str, RequestStream] = {}
        self._num_waiting = 0
        self._num_pending_adds = 0  # adds in the inbox, not yet seen by the engine
        self._stats = EngineStats()
        # Written under _cv, read by either side without it:
        self.closing = False  # shutdown() began: no new requests
        self.stopping = False  # the engine thread is to stop after this iteration
        self.error: BaseException | None = None  # why the engine died (or failed to start)
        self.engine_built = False

    # ---- the event loop's side ------------------------------------------------------------------------------

    def add(self, stream: RequestStream) -> None:
        """Reserve the stream's ids and queue it for the engine; raises what its caller must see at once."""
        with self._cv:
            self._check_accepting(stream.ids)
            for i in stream.ids:
                self._ids[i] = stream
            self._num_waiting += 1
            self._num_pending_adds += 1
            self._inbox.append(Command("add", stream))
            self._publish_locked(None)
            self._cv.notify()

    def _check_accepting(self, ids: list[str]) -> None:
        if self.error is not None:
            raise self.dead_error()
        if self.closing:
            raise EngineShutdownError("the engine is shutting down and accepts no new requests")
        taken = [i for i in ids if i in self._ids]
        if taken:
            raise ValueError(f"request id {taken[0]!r} is already in use by a request in flight")
        limit = self.max_num_queued_requests
        if limit is not None and self._num_waiting >= limit:
            raise QueueFullError(f"{self._num_waiting} requests are already waiting, the limit "
                                 f"(max_num_queued_requests) is {limit}; retry later")

    def abort(self, request_id: str) -> None:
        """Abort a parent request in flight; its stream ends with a final output (finish_reason "abort")."""
        with self._cv:
            stream = self._ids.get(request_id)
            if stream is None or stream.request_id != request_id or stream.ended:
                return
            self._release_locked(stream)
            self._inbox.append(Command("abort", stream, notify=True))
            self._cv.notify()

    def cancel(self, stream: RequestStream) -> None:
        """The consumer went away: abort in the engine, no output."""
        with self._cv:
            if stream.ended:
                return
            self._release_locked(stream)
            if self.error is None:
                self._inbox.append(Command("abort", stream))
                self._cv.notify()

    def call(self, call: Callable[..., None]) -> None:
        """Queue a call for the engine thread (engine/engine_calls.py): it runs between steps."""
        with self._cv:
            if self.error is not None:
                raise self.dead_error()
            self._inbox.append(Command("call", None, call=call))
            self._cv.notify()

    def in_flight(self) -> bool:
        with self._cv:
            return bool(self._ids)

    def begin_shutdown(self) -> None:
        with self._cv:
            self.closing = True

    def stop(self, engine_running: bool) -> list[RequestStream]:
        """End every request and stop the engine thread. A running engine aborts them (final "abort" outputs);
        otherwise nobody will, and they are returned for the caller to fail."""
        with self._cv:
            if engine_running:
                streams = self._unique_streams()
                for stream in streams:
                    self._release_locked(stream)
                self._inbox.extend(Command("abort", stream, notify=True) for stream in streams)
                streams = []
            else:
                streams = self._drop_all_locked()
                self._publish_locked(None)
            self.stopping = True
            self._cv.notify_all()
        return streams

    def snapshot(self) -> EngineStats:
        """The latest engine snapshot; requests submitted but not yet seen by the engine count as waiting."""
        with self._cv:
            return self._snapshot_locked()

    # ---- the engine thread's side ---------------------------------------------------------------------------

    def next_commands(self, has_work: Callable[[], bool], stuck: bool) -> tuple[list[Command], bool]:
        """Sleep until there is a command, work or a stop; take the inbox. Returns (commands, stop)."""
        with self._cv:
            while not self._inbox and not self.stopping and (stuck or not has_work()):
                if not self._cv.wait(STUCK_BACKOFF_S if stuck else None):
                    break  # backoff elapsed: try another step
            commands, self._inbox = self._inbox, []
            self._num_pending_adds = 0
            return commands, self.stopping

    def engine_started(self, stats: EngineStats) -> None:
        with self._cv:
            self.engine_built = True
            self._set_stats_locked(stats, None)

    def set_stats(self, stats: EngineStats) -> None:
        with self._cv:
            self._set_stats_locked(stats, None)

    def finish_iteration(self, stats: EngineStats, iteration: IterationStats, scheduled: list[RequestStream],
                         ended: list[RequestStream]) -> None:
        """Publish an iteration in the order a client can observe: ids and counts, then the loggers."""
        with self._cv:
            for stream in scheduled:
                if stream.waiting:
                    stream.waiting = False
                    self._num_waiting -= 1
            for stream in ended:
                self._release_locked(stream)
            self._set_stats_locked(stats, iteration)

    def requeue_aborts(self, streams: list[RequestStream]) -> None:
        """Abort these next iteration (their event loop is gone: nobody will read them)."""
        with self._cv:
            self._inbox.extend(Command("abort", stream) for stream in streams)

    def die(self, exc: BaseException) -> list[RequestStream]:
        """Mark the engine dead; returns every request in flight or queued, for the caller to fail."""
        with self._cv:
            self.error = exc
            streams = self._drop_all_locked()
            # Nothing runs or waits any more: the gauges must not freeze at their last values.
            stats = dataclasses.replace(self._stats, num_requests_running=0, num_requests_waiting=0)
            self._set_stats_locked(stats, None)
            self._cv.notify_all()
        return streams

    def drop_all(self) -> list[RequestStream]:
        """The engine stopped cleanly: release whatever is still registered (it cannot run any more)."""
        with self._cv:
            streams = self._drop_all_locked()
            self._publish_locked(None)
        return streams

    # ---- either side ----------------------------------------------------------------------------------------

    def fail(self, streams: list[RequestStream], error: EngineDeadError | None) -> None:
        """Post an error to each stream (a fresh exception each: they are raised in different tasks); None: the
        engine's death, as in-flight failures."""
        items = []
        for stream in streams:
            err = self.dead_error() if error is None else type(error)(str(error))
            err.in_flight = error is None
            items.append((stream, err))
        deliver(items)

    def dead_error(self) -> EngineDeadError:
        what = "the engine loop died" if self.engine_built else "the engine failed to start"
        err = EngineDeadError(f"{what}: {type(self.error).__name__}: {self.error}")
        err.__cause__ = self.error
        return err

    # ---- helpers (callers hold _cv) -------------------------------------------------------------------------

    def _release_locked(self, stream: RequestStream) -> None:
        if stream.ended:
            return
        stream.ended = True
        for i in stream.ids:
            if self._ids.get(i) is stream:
                del self._ids[i]
        if stream.waiting:
            stream.waiting = False
            self._num_waiting -= 1

    def _unique_streams(self) -> list[RequestStream]:
        return list({id(s): s for s in self._ids.values()}.values())

    def _drop_all_locked(self) -> list[RequestStream]:
        streams = self._unique_streams()
        for stream in streams:
            self._release_locked(stream)
        self._inbox.clear()
        self._num_pending_adds = 0
        return streams

    def _snapshot_locked(self) -> EngineStats:
        stats, pending = self._stats, self._num_pending_adds
        if pending:
            stats = dataclasses.replace(stats, num_requests_waiting=stats.num_requests_waiting + pending)
        return stats

    def _set_stats_locked(self, stats: EngineStats, iteration: IterationStats | None) -> None:
        self._stats = stats
        self._publish_locked(iteration)

    def _publish_locked(self, iteration: IterationStats | None) -> None:
        snapshot = self._snapshot_locked()
        for stat_logger in self._loggers:
            stat_logger.record(snapshot, iteration, self._engine_index)

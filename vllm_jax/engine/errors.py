"""What AsyncLLM raises to its callers; the server maps each to an HTTP status (server/engine_streams.py)."""

from __future__ import annotations


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


class EngineSleepingError(RuntimeError):
    """The engine is asleep (sleep mode) and generates nothing until wake_up(); the server answers 503."""

"""The scheduling policy's two choices (--scheduling-policy: fcfs or priority): which waiting request is admitted
next, and which running request gives way when the KV cache is full (docs/architecture/03-scheduler.md,
"Scheduling"). Pure functions of the queues; the Scheduler owns the queues."""

from __future__ import annotations

from collections.abc import Iterable

from vllm_jax.scheduler.request import Request


def _priority_key(request: Request) -> tuple[int, float]:
    return (request.priority, request.arrival_time)


def pick_victim(running: list[Request], policy: str) -> Request:
    """The policy's victim (fcfs: the last running request; priority: the lowest priority, then the latest arrival)
    among running requests that progressed since they last resumed (all of them, if none did: never a deadlock)."""
    candidates = [r for r in running if not r.awaiting_progress] or running
    if policy == "priority":
        return max(candidates, key=_priority_key)
    return candidates[-1]


def next_waiting(waiting: Iterable[Request], policy: str, skip: set[str] | frozenset[str] = frozenset()) -> Request:
    """The next waiting request in policy order, passing over the ids in `skip`."""
    candidates = (r for r in waiting if r.request_id not in skip)
    if policy == "priority":
        return min(candidates, key=_priority_key)
    return next(candidates)

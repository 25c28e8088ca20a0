"""Calls AsyncLLM runs on its engine thread between steps: pause / resume of generation, and the RL loop's
sleep, wake_up, update_weights and reset_prefix_cache (docs/architecture/02-engine.md, "Pause and resume").

vLLM's pause modes: "abort" ends every request in flight (finish_reason "abort") and pauses; "wait" lets them
finish, then pauses; "keep" freezes them where they are and they continue after resume_generation, with the same
tokens as if never paused. While paused (or draining for "wait") new requests are held, not refused: they start
after resume. The engine thread owns `PauseState`; only these calls change it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PAUSE_MODES = ("abort", "wait", "keep")


@dataclass
class PauseState:
    paused: bool = False
    draining: bool = False  # mode "wait": no new request starts; paused once the ones in flight finished
    held: list = field(default_factory=list)  # "add" commands that arrived while paused or draining
    waiters: list[Callable[[], None]] = field(default_factory=list)  # "wait" callers, told when drained

    @property
    def holds_new_requests(self) -> bool:
        return self.paused or self.draining

    def after_iteration(self, engine: Any) -> None:
        """Mode "wait": pause once nothing is in flight any more."""
        if self.draining and not engine.has_work():
            self.draining, self.paused = False, True
            for tell in self.waiters:
                tell()
            self.waiters.clear()


def reply(future: asyncio.Future, value: Any = None, error: BaseException | None = None) -> Callable[[], None]:
    """A thread-safe setter of `future`'s outcome, for the engine thread."""
    loop = future.get_loop()

    def tell() -> None:
        def settle() -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        loop.call_soon_threadsafe(settle)

    return tell


def pause(loop: Any, engine: Any, result: Any, mode: str, future: asyncio.Future) -> None:
    """The engine thread's side of AsyncLLM.pause_generation."""
    state: PauseState = loop.pause_state
    if mode == "abort":
        loop.abort_all(engine, result)
    if mode == "wait" and engine.has_work():
        state.draining = True
        state.waiters.append(reply(future))
        return
    state.paused = True
    reply(future)()


def resume(loop: Any, engine: Any, result: Any, future: asyncio.Future) -> None:
    """Unpause; the held requests start now."""
    state: PauseState = loop.pause_state
    state.paused = state.draining = False
    for tell in state.waiters:  # a "wait" pause that never completed
        tell()
    state.waiters.clear()
    held, state.held = state.held, []
    loop.apply_commands(engine, held, result)
    reply(future)()


def run(fn: Callable[[Any], Any], future: asyncio.Future) -> Callable[..., None]:
    """An engine call: fn(engine)'s value or error to the future (an error fails the call, not the engine)."""

    def call(loop: Any, engine: Any, result: Any) -> None:
        try:
            value = fn(engine)
        except Exception as exc:  # noqa: BLE001 - the caller gets it; the engine is unchanged
            reply(future, error=exc)()
            return
        reply(future, value)()

    return call

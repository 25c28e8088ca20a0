"""Running engine requests on behalf of one HTTP request: start, merge, and abort on every way out.

One HTTP request can own several engine requests (a completions call with a list of prompts). `RequestStreams`
starts them together, maps the errors the engine raises on the first iteration to HTTP errors (before any
byte of the response is sent), merges their outputs, and aborts whatever has not finished when it is closed:
on a client disconnect, a cancellation, an error in a sibling request or server shutdown. `await_or_disconnect`
races an awaitable against the client going away, for the parts that run before a streaming body exists
(non-streaming requests, and waiting for a streaming request's first output).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request

from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.engine.errors import EngineDeadError, EngineSleepingError, QueueFullError
from vllm_jax.outputs import RequestOutput
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.server.errors import APIError, ClientDisconnected, bad_request, unavailable
from vllm_jax.server.protocol import guess_param

logger = logging.getLogger("vllm_jax.server")

T = TypeVar("T")
DISCONNECT_POLL_S = 0.2
_DONE = object()


def engine_error(exc: BaseException, *, starting: bool) -> APIError | None:
    """The HTTP error for an exception from the engine, or None when it is a server bug (answered with 500).

    A ValueError or TypeError on the first iteration is the engine rejecting the input (400); later, it can only
    be a failure inside the engine. An engine that dies under an accepted request fails it with 500; one that was
    already dead refuses new requests with 503.
    """
    if isinstance(exc, EngineSleepingError):
        return unavailable(f"{exc} (POST /wake_up)", code="engine_sleeping")
    if isinstance(exc, QueueFullError):
        return unavailable(f"The server is overloaded: {exc}. Retry later.", code="queue_full")
    if isinstance(exc, EngineDeadError) and exc.in_flight:
        return APIError(500, f"The engine failed while serving this request: {exc}", code="engine_dead")
    if isinstance(exc, EngineDeadError):
        return unavailable(f"The engine is not running: {exc}", code="engine_dead")
    if starting and isinstance(exc, (ValueError, TypeError)):
        return bad_request(str(exc), param=guess_param(str(exc)), code="invalid_value")
    return None


async def await_or_disconnect(aw: Awaitable[T], request: Request) -> T:
    """Await `aw`, cancelling it (which aborts its engine requests) if the client disconnects first."""
    task = asyncio.ensure_future(aw)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnected()
    finally:
        if not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(task, return_exceptions=True)


async def start_or_abort(streams: RequestStreams, request: Request) -> None:
    """Start a streaming response's engine requests; if that fails (bad input, disconnect), abort them all."""
    try:
        await await_or_disconnect(streams.start(), request)
    except BaseException:
        await streams.close()
        raise


class RequestStreams:
    """The engine requests of one HTTP request; iterate for `(prompt_index, RequestOutput)` pairs."""

    def __init__(self, engine: AsyncLLM, prompts: list[list[int] | dict[str, Any]], params: list[SamplingParams],
                 request_ids: list[str], *, priority: int = 0, cache_salt: str | None = None,
                 lora_request: Any = None):
        self.engine, self.request_ids = engine, request_ids
        self._gens = [engine.generate(ids, p, rid, priority=priority, cache_salt=cache_salt,
                                      lora_request=lora_request)
                      for ids, p, rid in zip(prompts, params, request_ids)]
        self._finished = [False] * len(self._gens)
        self._first: list[Any] = []
        self._queue: asyncio.Queue = asyncio.Queue()
        self._pumps: list[asyncio.Task] = []
        self._closed = False

    async def start(self) -> None:
        """Add every request and wait for its first output; raises the mapped APIError if any is rejected."""
        tasks = [asyncio.ensure_future(_next_or_done(g)) for g in self._gens]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in tasks:
                if t.done() and t.exception() is not None:
                    exc = t.exception()
                    mapped = engine_error(exc, starting=True)
                    if mapped is None:
                        raise exc
                    raise mapped from exc
            self._first = [t.result() for t in tasks]
        finally:
            for t in tasks:
                t.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        remaining = 0
        for i, first in enumerate(self._first):
            if first is _DONE:
                self._finished[i] = True
                continue
            yield i, first
            if first.finished:
                self._finished[i] = True
            else:
                remaining += 1
                self._pumps.append(asyncio.ensure_future(self._pump(i)))
        while remaining:
            i, item = await self._queue.get()
            if item is _DONE:
                remaining -= 1
                self._finished[i] = True
            elif isinstance(item, BaseException):
                raise item
            else:
                if item.finished:
                    self._finished[i] = True
                yield i, item

    async def _pump(self, i: int) -> None:
        try:
            async for out in self._gens[i]:
                await self._queue.put((i, out))
            await self._queue.put((i, _DONE))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - forwarded to the consumer, which answers it
            await self._queue.put((i, exc))

    async def close(self) -> None:
        """Stop every pump and abort every request that has not finished (idempotent, shielded)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            for t in self._pumps:
                t.cancel()
            await asyncio.gather(*self._pumps, return_exceptions=True)
            for gen in self._gens:
                try:
                    await gen.aclose()
                except Exception:
                    logger.debug("closing an engine stream failed", exc_info=True)
            for rid, done in zip(self.request_ids, self._finished):
                if not done:
                    try:
                        await self.engine.abort(rid)
                    except Exception:
                        logger.warning("aborting request %s failed", rid, exc_info=True)


async def _next_or_done(gen: AsyncIterator[RequestOutput]) -> Any:
    try:
        return await gen.__anext__()
    except StopAsyncIteration:
        return _DONE

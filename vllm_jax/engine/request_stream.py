"""One request's link between the event loop that awaits it and the engine thread, and the commands about it.

Each request has an asyncio.Queue on the loop that started it; the engine thread fills it through
`loop.call_soon_threadsafe`, one call per loop per iteration (`deliver`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from vllm_jax.engine.llm_engine import PromptType
from vllm_jax.lora.request import LoRARequest
from vllm_jax.metrics.stats import RequestTimer
from vllm_jax.outputs import RequestOutput
from vllm_jax.sampling_params import SamplingParams


@dataclass(eq=False)
class RequestStream:
    request_id: str
    ids: list[str]  # the request id, then its child ids when n > 1: all reserved while in flight
    prompt: PromptType
    params: SamplingParams
    priority: int
    cache_salt: str | None
    arrival_wall: float
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    timer: RequestTimer  # engine thread only
    lora_request: LoRARequest | None = None
    # Guarded by the RequestRegistry's lock:
    waiting: bool = True  # counted as waiting (not scheduled yet) for max_num_queued_requests
    ended: bool = False  # ids released; the consumer gets nothing more than what is already posted


@dataclass
class Command:
    kind: Literal["add", "abort", "call"]
    stream: RequestStream | None
    notify: bool = False  # abort: send the consumer a final output with finish_reason "abort"
    call: Callable[..., None] | None = None  # call: run on the engine thread (engine/engine_calls.py)


Delivery = tuple[RequestStream, RequestOutput | BaseException]


def deliver(deliveries: list[Delivery]) -> list[RequestStream]:
    """Hand items to their streams' loops, one thread-safe call per loop; returns streams whose loop is closed."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Delivery]] = {}
    for stream, item in deliveries:
        by_loop.setdefault(stream.loop, []).append((stream, item))
    orphans: list[RequestStream] = []
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:  # the loop is closed
            orphans.extend(s for s, _ in items)
    return orphans


def _put_all(items: list[Delivery]) -> None:
    for stream, item in items:
        stream.queue.put_nowait(item)

"""Server-sent events as OpenAI streams them: `data: {json}\\n\\n` per chunk, then `data: [DONE]\\n\\n`.

`SSEResponse` closes its body generator and runs its `on_close` however the response ends (finished, client
gone, server shutting down), so engine requests are aborted at once, not whenever the garbage collector gets to
the generator.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import anyio
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from vllm_jax.server.engine_streams import engine_error
from vllm_jax.server.errors import APIError, error_body

SSE_DONE = "data: [DONE]\n\n"
logger = logging.getLogger("vllm_jax.server")


def sse_event(payload: BaseModel | dict[str, Any]) -> str:
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


def stream_error_event(exc: Exception, request_id: str) -> str:
    """An error after the 200 status line went out: one `data: {"error": ...}` event, as vLLM sends it."""
    mapped = engine_error(exc, starting=False)
    if mapped is None:
        logger.error("request %s failed while streaming", request_id, exc_info=exc)
        mapped = APIError(500, f"Internal server error ({type(exc).__name__}); see the server log.",
                          code="internal_error")
    return sse_event(error_body(mapped.status, mapped.message, type=mapped.type, code=mapped.code))


class SSEResponse(StreamingResponse):
    """A text/event-stream response that always runs `on_close` (e.g. aborting the engine requests) at its end,
    even when the client left before the body generator was first entered (its `finally` would never run)."""

    def __init__(self, body: AsyncGenerator[str, None], on_close: Callable[[], Awaitable[None]] | None = None):
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._body, self._on_close = body, on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._body.aclose()
                if self._on_close is not None:
                    await self._on_close()

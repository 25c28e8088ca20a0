"""Two gates in front of every route, as plain ASGI middleware (no BaseHTTPMiddleware: it would buffer
streaming responses and hide client disconnects from the endpoints).

- `ApiKeyMiddleware`: with `--api-key`, every route but the open ones (health, metrics, version, the API docs)
  needs `Authorization: Bearer <key>`; the key is compared in constant time.
- `BodyLimitMiddleware`: a body larger than `--max-request-bytes` (default DEFAULT_MAX_REQUEST_BYTES, 16 MiB:
  far more than any prompt that fits a context, far less than what would hurt the host) is answered with 413
  before any parsing.
  The body is read in full (up to a cap) first, so that the client, still uploading, reads the 413 instead of
  a reset connection; beyond the cap the connection is simply closed after the 413.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_jax.server.errors import APIError, error_response

OPEN_PATHS = frozenset({"/health", "/metrics", "/version", "/docs", "/docs/oauth2-redirect", "/redoc",
                        "/openapi.json"})
_DRAIN_CAP_BYTES = 64 << 20
DEFAULT_MAX_REQUEST_BYTES = 16 << 20


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        if not hmac.compare_digest(given, self._expected):
            message = ("Missing API key: send it as 'Authorization: Bearer <key>'." if not given
                       else "Incorrect API key provided.")
            await error_response(APIError(401, message, code="invalid_api_key"))(scope, receive, send)
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            if declared <= _DRAIN_CAP_BYTES:
                await _drain(receive, _DRAIN_CAP_BYTES)
            await self._reject(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            more = message.get("more_body", False)
            if size > self.max_bytes:
                if more:
                    await _drain(receive, _DRAIN_CAP_BYTES - size)
                await self._reject(scope, receive, send)
                return
            chunks.append(chunk)
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = APIError(413, f"The request body is larger than the server's limit of {self.max_bytes} bytes "
                            "(--max-request-bytes).", code="request_too_large")
        await error_response(err)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _drain(receive: Receive, budget: int) -> None:
    """Read and drop the rest of the body, up to `budget` bytes."""
    while budget > 0:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return
        budget -= len(message.get("body", b""))


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands out the buffered body once, then the real channel (to see disconnects)."""
    sent = False

    async def wrapped() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return wrapped

"""Every error the server sends has OpenAI's body: `{"error": {"message", "type", "param", "code"}}`.

Handlers turn each failure into that body with the right status: `APIError` (raised by our own checks),
FastAPI's validation errors and malformed JSON (400, where FastAPI would say 422), Starlette's HTTP errors
(unknown route, wrong method) and, as a last resort, any other exception (500, logged with its traceback, the
message kept generic so that internals do not leak). Bad input must never reach that last handler: messages that
echo the input (a model name, a dict key) are made encodable first, since JSON can carry lone surrogates that
UTF-8 cannot. The OpenAPI schema documents these 400s instead of FastAPI's 422, which the server never sends.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("vllm_jax.server")

# OpenAI's `type` strings by status class.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 499: "client_closed_request",
          500: "server_error", 503: "service_unavailable_error"}


class APIError(Exception):
    """An error answered with OpenAI's body; `code` is a short machine-readable string."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


class ClientDisconnected(Exception):
    """The client went away before its response was ready; its engine requests were aborted."""


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")


def unavailable(message: str, code: str) -> APIError:
    return APIError(503, message, code=code)


def encodable(text: str) -> str:
    """`text` with lone surrogates (from JSON escapes like \\ud800) spelled out, so that it encodes as UTF-8."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(status: int, message: str, *, type: str | None = None, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The JSON body for an error (also used inside SSE streams, where the status line is already sent)."""
    kind = type or _TYPES.get(status, "server_error")
    return {"error": {"message": encodable(message), "type": kind,
                      "param": None if param is None else encodable(param), "code": code}}


def error_response(err: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(error_body(err.status, err.message, type=err.type, param=err.param, code=err.code),
                        status_code=err.status, headers=headers)


# Fields whose type is a union: pydantic reports one error per branch; one sentence reads better.
_UNION_HINTS = {
    "prompt": "must be a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "must be a string or a list of strings",
    "content": "must be a string or a list of content parts",
    "tool_choice": 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
    "arguments": "must be a JSON string or an object",
}
_NOT_AN_OBJECT = ("the request body must be a JSON object, sent with 'Content-Type: application/json'")


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """A readable one-line summary of pydantic errors, and the first offending field (OpenAI's `param`)."""
    parts: list[str] = []
    param: str | None = None
    for err in exc.errors()[:8]:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        # Union branches add the branch's type name to the location; keep only field names and indices.
        loc = [x for x in loc if not (x.startswith(("list[", "function-")) or x in ("str", "int", "float"))]
        where = ".".join(loc)
        if err.get("type") in ("json_invalid", "json_type"):
            at = [x for x in err.get("loc", ()) if isinstance(x, int)]
            position = f" (at character {at[0]})" if at else ""
            parts.append(f"the body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}{position}")
            continue
        if err.get("type") == "missing" and not where:
            parts.append("the request body is missing; send a JSON object")
            continue
        if not where and err.get("type") in ("model_attributes_type", "model_type", "dict_type"):
            parts.append(_NOT_AN_OBJECT)
            continue
        param = param or (loc[0] if loc else None)
        hinted = next((i for i, x in enumerate(loc) if x in _UNION_HINTS), None)
        if hinted is not None and "union" not in str(err.get("type")):
            parts.append(f"{'.'.join(loc[:hinted + 1])}: {_UNION_HINTS[loc[hinted]]}")
            continue
        parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "; ".join(dict.fromkeys(parts)) or "invalid request", param


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure through OpenAI's error body (see the module docstring)."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(bad_request(message, param=param, code="invalid_value"))

    @app.exception_handler(ClientDisconnected)
    async def _client_gone(request: Request, _: ClientDisconnected) -> JSONResponse:
        logger.info("client disconnected from %s %s; its requests were aborted", request.method, request.url.path)
        return error_response(APIError(499, "The client closed the request.", code="client_closed_request"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        message = str(exc.detail)
        if status == 404 and message == "Not Found":
            message = "Not found: this route does not exist (see /docs for the API)."
        elif status == 400 and "parsing the body" in message:
            message = _unparsable_body_message(exc.__cause__)
        return error_response(APIError(status, message))

    app.openapi = _openapi_without_422(app)  # type: ignore[method-assign]

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises the exception after this response, so uvicorn logs its traceback once.
        logger.error("internal error while serving %s %s: %r", request.method, request.url.path, exc)
        return error_response(APIError(500, f"Internal server error ({type(exc).__name__}); see the server log.",
                                       code="internal_error"))


def _unparsable_body_message(cause: BaseException | None) -> str:
    """Why FastAPI could not read the body (it wraps every reason in one generic HTTP 400)."""
    if isinstance(cause, UnicodeDecodeError):
        return (f"The request body is not valid UTF-8 (byte 0x{cause.object[cause.start]:02x} at position "
                f"{cause.start}); send a UTF-8 JSON object.")
    if isinstance(cause, RecursionError):
        return "The request body's JSON is nested too deeply to parse."
    return "The request body could not be parsed; send a UTF-8 JSON object."


def _openapi_without_422(app: FastAPI) -> Any:
    """FastAPI documents a 422 for every route with a body; this server answers schema violations with 400."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi

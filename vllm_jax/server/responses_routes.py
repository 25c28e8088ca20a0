"""The Responses API's routes: POST /v1/responses, GET / DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel
(serving_responses.py does the work)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from vllm_jax.server.protocol_responses import ResponseObject, ResponsesRequest
from vllm_jax.server.responses import ErrorResponse, json_or_sse
from vllm_jax.server.responses_store import ResponsesStore
from vllm_jax.server.serving import ServingContext
from vllm_jax.server.serving_responses import ResponsesServing

_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 500, 503)}


def add_responses_routes(app: FastAPI, ctx: ServingContext, store_size: int) -> ResponsesServing:
    """`store_size` 0: no store (--disable-responses-store): nothing is kept, previous_response_id is a 400."""
    serving = ResponsesServing(ctx, ResponsesStore(store_size) if store_size > 0 else None)

    @app.post("/v1/responses", responses={**_ERRORS, **json_or_sse(ResponseObject)})
    async def create_response(body: ResponsesRequest, raw: Request) -> Response:
        """OpenAI's Responses API, served by the chat pipeline; stream=true sends its typed events."""
        return await serving.create(body, raw)

    @app.get("/v1/responses/{response_id}", responses=_ERRORS)
    async def retrieve_response(response_id: str) -> dict[str, Any]:
        return serving.retrieve(response_id)

    @app.delete("/v1/responses/{response_id}", responses=_ERRORS)
    async def delete_response(response_id: str) -> dict[str, Any]:
        return serving.delete(response_id)

    @app.post("/v1/responses/{response_id}/cancel", responses=_ERRORS)
    async def cancel_response(response_id: str) -> dict[str, Any]:
        return await serving.cancel(response_id)

    return serving

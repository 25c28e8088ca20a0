"""vLLM's runtime LoRA routes: `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`, served only when the
environment sets VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (as in vLLM: anyone who can reach the API can then make the
server read a directory). A loaded adapter is read and checked before it is named (a bad one is a 400, nothing
registered); then a request's `model` may name it (docs/architecture/11-lora.md, "LoRA adapters")."""

from __future__ import annotations

import asyncio
import itertools
import os

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import Field

from vllm_jax.lora.request import LoRARequest
from vllm_jax.server.errors import APIError, bad_request
from vllm_jax.server.openai_base import OpenAIRequestModel
from vllm_jax.server.serving import ServingContext

ENV_FLAG = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def runtime_updates_allowed() -> bool:
    return os.environ.get(ENV_FLAG, "").strip().lower() in ("1", "true")


class LoadLoRAAdapterRequest(OpenAIRequestModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRAAdapterRequest(OpenAIRequestModel):
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None


def add_lora_routes(app: FastAPI, ctx: ServingContext) -> None:
    """The two routes, when the environment allows runtime updates (else they do not exist: 404)."""
    if not runtime_updates_allowed():
        return
    first_id = max((r.lora_int_id for r in ctx.lora_adapters.values()), default=0) + 1
    ids = itertools.count(first_id)

    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> str:
        ctx.require_ready()
        if ctx.engine.config.lora_config is None:
            raise bad_request("LoRA is not enabled: start the server with --enable-lora", param="lora_name")
        engine = getattr(ctx.engine, "llm_engine", None)
        if engine is None:
            raise bad_request("loading LoRA adapters at run time is not supported with data parallelism yet",
                              param="lora_name")
        if body.lora_name in ctx.lora_adapters or body.lora_name in ctx.served_model_names:
            raise bad_request(f"The lora adapter '{body.lora_name}' has already been loaded.", param="lora_name")
        request = LoRARequest(body.lora_name, next(ids), body.lora_path)
        try:  # read and check it now (off the event loop), so a bad adapter is refused here
            await asyncio.to_thread(engine.runner.lora_cache.get, request)
        except ValueError as exc:
            raise bad_request(str(exc), param="lora_path") from exc
        ctx.lora_adapters[body.lora_name] = request
        return f"Success: LoRA adapter '{body.lora_name}' added successfully."

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> str:
        request = ctx.lora_adapters.get(body.lora_name)
        if request is None or (body.lora_int_id is not None and body.lora_int_id != request.lora_int_id):
            raise APIError(404, f"The lora adapter '{body.lora_name}' cannot be found.", param="lora_name",
                           code="model_not_found")
        del ctx.lora_adapters[body.lora_name]  # running requests finish with it; new ones cannot name it
        return f"Success: LoRA adapter '{body.lora_name}' removed successfully."

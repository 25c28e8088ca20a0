"""vLLM's development routes for RL loops, served only when the environment sets VLLM_SERVER_DEV_MODE=1 (as in
vLLM: anyone who can reach them can free the devices or load other weights): POST /sleep?level=N, POST
/wake_up[?tags=weights&tags=kv_cache], GET /is_sleeping, POST /reset_prefix_cache, POST /pause[?mode=abort|wait|
keep], POST /resume, GET /is_paused and POST /update_weights {"path": ...} (docs/rl.md). While the engine sleeps,
/health stays 200 and generation requests get a 503 that says so."""

from __future__ import annotations

import os
from typing import Annotated

from fastapi import FastAPI, Query
from pydantic import Field

from vllm_jax.server.errors import bad_request
from vllm_jax.server.openai_base import OpenAIRequestModel
from vllm_jax.server.serving import ServingContext

ENV_FLAG = "VLLM_SERVER_DEV_MODE"


class UpdateWeightsRequest(OpenAIRequestModel):
    path: str = Field(min_length=1)  # a safetensors checkpoint directory or a GGUF file, on the server's disk


def dev_mode() -> bool:
    return os.environ.get(ENV_FLAG, "").strip().lower() in ("1", "true")


def add_dev_routes(app: FastAPI, ctx: ServingContext) -> None:
    """The routes, when VLLM_SERVER_DEV_MODE=1 (else they do not exist: 404)."""
    if not dev_mode():
        return

    async def engine_call(name: str, *args, **kwargs):
        ctx.require_ready()
        try:  # a data-parallel engine sends each call to every replica (engine/data_parallel.py)
            return await getattr(ctx.engine, name)(*args, **kwargs)
        except (ValueError, RuntimeError) as exc:  # a bad argument, requests in flight, no sleep mode
            raise bad_request(str(exc)) from exc

    @app.post("/sleep")
    async def sleep(level: int = 1) -> dict:
        await engine_call("sleep", level)
        return {}

    @app.post("/wake_up")
    async def wake_up(tags: Annotated[list[str] | None, Query()] = None) -> dict:
        await engine_call("wake_up", tags)
        return {}

    @app.get("/is_sleeping")
    async def is_sleeping() -> dict:
        return {"is_sleeping": await engine_call("is_sleeping")}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict:
        return {"reset": await engine_call("reset_prefix_cache")}

    @app.post("/pause")
    async def pause(mode: str = "abort") -> dict:
        await engine_call("pause_generation", mode)
        return {}

    @app.post("/resume")
    async def resume() -> dict:
        await engine_call("resume_generation")
        return {}

    @app.get("/is_paused")
    async def is_paused() -> dict:
        return {"is_paused": await engine_call("is_paused")}

    @app.post("/update_weights")
    async def update_weights(body: UpdateWeightsRequest) -> dict:
        return {"updated": await engine_call("update_weights", body.path)}

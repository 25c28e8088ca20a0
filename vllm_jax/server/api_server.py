"""The OpenAI-compatible HTTP app: `build_app(engine, ...)` -> FastAPI.

Routes: /v1/completions, /v1/chat/completions, /v1/responses (serving_completions.py, serving_chat.py,
serving_responses.py), /v1/models,
/tokenize, /detokenize, /version, /health, /metrics, and with `enable_tokenizer_info` (vLLM's
--enable-tokenizer-info-endpoint, off by default since it shows the chat template) /tokenizer_info. The app
does not own the engine's lifecycle: whoever builds it starts the engine (and shuts it down) — `vllm-jax serve`
does both around uvicorn (launcher.py). While the engine warms up the app already answers: /health and every
generation route with 503.

Error bodies, the API key and the body-size limit are explained in errors.py and middleware.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

import vllm_jax
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.reasoning import get_reasoning_parser
from vllm_jax.server.chat_messages import chat_conversation
from vllm_jax.server.dev_routes import add_dev_routes
from vllm_jax.server.errors import APIError, error_response, install_error_handlers
from vllm_jax.server.lora_routes import add_lora_routes
from vllm_jax.server.middleware import DEFAULT_MAX_REQUEST_BYTES, ApiKeyMiddleware, BodyLimitMiddleware
from vllm_jax.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from vllm_jax.server.responses import (
    ChatCompletionResponse,
    CompletionResponse,
    DetokenizeResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
    json_or_sse,
)
from vllm_jax.server.responses_routes import add_responses_routes
from vllm_jax.server.responses_store import DEFAULT_RESPONSES_STORE_SIZE
from vllm_jax.server.serving import ServingContext, load_chat_template
from vllm_jax.server.serving_chat import create_chat_completion
from vllm_jax.server.serving_completions import create_completion
from vllm_jax.server.serving_pooling import add_pooling_routes
from vllm_jax.server.tokenizer_info import tokenizer_info
from vllm_jax.server.tool_parsers import auto_tool_parser

if TYPE_CHECKING:
    from vllm_jax.metrics.prometheus import PrometheusStatLogger

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 500, 503)}


def build_app(engine: AsyncLLM, *, served_model_names: list[str], api_key: str | None, chat_template: str | None,
              max_request_bytes: int | None = None, log_requests: bool = False,
              metrics: PrometheusStatLogger | None = None, enable_tokenizer_info: bool = False,
              enable_auto_tool_choice: bool = False, tool_call_parser: str | None = None,
              responses_store_size: int = DEFAULT_RESPONSES_STORE_SIZE) -> FastAPI:
    """The app serving `engine` (an AsyncLLM) under `served_model_names` (the first is the default name).

    `metrics`: the Prometheus logger the engine feeds, served at /metrics (None: an empty /metrics).
    `enable_auto_tool_choice` with `tool_call_parser`: tool_choice "auto" parses calls with that parser (vLLM's
    flags). The reasoning parser is the engine config's (`--reasoning-parser`). `responses_store_size`: responses
    kept for /v1/responses' previous_response_id and GET (0: none, --disable-responses-store)."""
    if not served_model_names:
        raise ValueError("served_model_names must name at least one model")
    reasoning = engine.config.reasoning_parser
    ctx = ServingContext(engine=engine, served_model_names=list(served_model_names),
                         chat_template=load_chat_template(chat_template), log_requests=log_requests,
                         tool_parser=auto_tool_parser(enable_auto_tool_choice, tool_call_parser),
                         reasoning_parser=get_reasoning_parser(reasoning) if reasoning else None)
    app = FastAPI(title="vllm-jax", version=vllm_jax.__version__,
                  description="OpenAI-compatible API of vllm_jax (a JAX reimplementation of vLLM).")
    app.state.serving = ctx
    install_error_handlers(app)
    # The last one added runs first: the key is checked before the body is read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes or DEFAULT_MAX_REQUEST_BYTES)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    _add_generation_routes(app, ctx)
    _add_info_routes(app, ctx, prometheus=metrics)
    add_lora_routes(app, ctx)
    add_responses_routes(app, ctx, responses_store_size)
    add_dev_routes(app, ctx)
    add_pooling_routes(app, ctx)
    if enable_tokenizer_info:
        _add_tokenizer_info_route(app, ctx)
    return app


def _add_generation_routes(app: FastAPI, ctx: ServingContext) -> None:
    @app.post("/v1/completions", responses={**_ERRORS, **json_or_sse(CompletionResponse)})
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        """OpenAI completions (text or token-id prompts, a list of them, streaming or not)."""
        return await create_completion(ctx, body, raw)

    @app.post("/v1/chat/completions", responses={**_ERRORS, **json_or_sse(ChatCompletionResponse)})
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        """OpenAI chat completions, rendered with the model's (or --chat-template's) chat template."""
        return await create_chat_completion(ctx, body, raw)

    @app.post("/tokenize", responses=_ERRORS)
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        """vLLM's /tokenize: token ids of a prompt, or of messages rendered with the chat template."""
        ctx.model_name(body.model)
        ctx.require_ready()
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "Send exactly one of `prompt` and `messages`.", param="prompt")
        if body.prompt is not None:
            special = True if body.add_special_tokens is None else body.add_special_tokens
            ids = await ctx.tokenize(body.prompt, add_special_tokens=special)
        else:
            try:
                conversation = chat_conversation(body.messages or [])
            except ValueError as exc:  # a bad content part names its place (messages[0].content[1])
                raise APIError(400, str(exc), param=getattr(exc, "param", None) or "messages") from exc
            if not conversation:
                raise APIError(400, "messages must not be empty.", param="messages")
            text = ctx.render_chat(conversation, add_generation_prompt=body.add_generation_prompt,
                                   continue_final_message=body.continue_final_message,
                                   template_kwargs=body.chat_template_kwargs,
                                   tools=[tool.template_dict() for tool in body.tools] if body.tools else None)
            ids = await ctx.tokenize(text, add_special_tokens=bool(body.add_special_tokens), param="messages")
        strs = ctx.engine.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=ctx.max_model_len, tokens=ids, token_strs=strs)

    @app.post("/detokenize", responses=_ERRORS)
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        """vLLM's /detokenize: the text of token ids."""
        ctx.model_name(body.model)
        ctx.require_ready()
        return DetokenizeResponse(prompt=ctx.detokenize(list(body.tokens)))


def _add_info_routes(app: FastAPI, ctx: ServingContext, prometheus: PrometheusStatLogger | None) -> None:
    def card(name: str) -> ModelCard:
        lora = ctx.lora_request(name) if name not in ctx.served_model_names else None
        if lora is not None:  # an adapter: its base model is its parent (vLLM's card)
            return ModelCard(id=name, root=lora.lora_path, parent=ctx.served_model_names[0],
                             max_model_len=ctx.max_model_len)
        return ModelCard(id=name, root=ctx.engine.config.model_config.model, max_model_len=ctx.max_model_len)

    @app.get("/v1/models", responses=_ERRORS)
    async def list_models() -> ModelList:
        """The served model names (all of them name the same engine), then the LoRA adapters."""
        return ModelList(data=[card(name) for name in [*ctx.served_model_names, *ctx.lora_adapters]])

    @app.get("/v1/models/{model_id:path}", responses=_ERRORS)
    async def retrieve_model(model_id: str) -> ModelCard:
        return card(ctx.model_name(model_id))

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": vllm_jax.__version__}

    @app.get("/health", responses={503: {"model": ErrorResponse}})
    async def health() -> Response:
        """200 once the engine is warmed up and its loop is alive; 503 while warming up or after it died."""
        try:
            ctx.require_ready()
        except APIError as err:
            return error_response(err)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text exposition with vLLM's metric names (empty when stats are disabled)."""
        body = prometheus.render() if prometheus is not None else b""
        return Response(content=body, media_type=PROMETHEUS_CONTENT_TYPE)


def _add_tokenizer_info_route(app: FastAPI, ctx: ServingContext) -> None:
    @app.get("/tokenizer_info", responses=_ERRORS)
    async def get_tokenizer_info() -> dict[str, Any]:
        """vLLM's /tokenizer_info: the tokenizer's configuration, its class and the chat template."""
        ctx.require_ready()
        return tokenizer_info(ctx.engine.tokenizer, ctx.chat_template)

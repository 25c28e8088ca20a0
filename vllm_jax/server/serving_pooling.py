"""The pooling routes (vLLM's): /v1/embeddings (OpenAI's), /pooling, /classify, /score and /v1/score, /rerank,
/v1/rerank and /v2/rerank (Jina's / Cohere's shapes), served when the engine runs runner 'pooling'.

Each prompt is one engine request with PoolingParams; its vector arrives on its final RequestOutput
(docs/architecture/14-pooling.md, "Serving"). On a generate engine these routes are 400s naming the runner, as
the generation routes are on a pooling engine (the engine refuses the other kind of request).
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from pydantic import Field

from vllm_jax.outputs import RequestOutput
from vllm_jax.pooling_params import PoolingParams, cosine, pair_token_ids, pair_up
from vllm_jax.server.engine_streams import await_or_disconnect, engine_error
from vllm_jax.server.errors import APIError, bad_request
from vllm_jax.server.openai_base import OpenAIBaseModel, OpenAIRequestModel
from vllm_jax.server.responses import ErrorResponse
from vllm_jax.server.serving import ServingContext

Input = str | list[str] | list[int] | list[list[int]]
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 500, 503)}


class PoolingRequest(OpenAIRequestModel):
    """/v1/embeddings, /pooling and /classify: OpenAI's embeddings body, with vLLM's extras."""

    model: str | None = None
    input: Input
    dimensions: int | None = None
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    add_special_tokens: bool = True


class ScoreRequest(OpenAIRequestModel):
    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    truncate_prompt_tokens: int | None = None


class RerankRequest(OpenAIRequestModel):
    model: str | None = None
    query: str
    documents: list[str]
    top_n: int | None = None
    return_documents: bool = True
    truncate_prompt_tokens: int | None = None


class PoolingUsage(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0


class PoolingResponse(OpenAIBaseModel):
    id: str
    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[dict[str, Any]]
    usage: PoolingUsage


class RerankResponse(OpenAIBaseModel):
    id: str
    model: str
    usage: dict[str, int]
    results: list[dict[str, Any]]


def add_pooling_routes(app: FastAPI, ctx: ServingContext) -> None:
    @app.post("/v1/embeddings", responses=_ERRORS)
    async def embeddings(body: PoolingRequest, raw: Request) -> PoolingResponse:
        """OpenAI's embeddings: one vector per input (float list or base64 of little-endian float32)."""
        model = _admit(ctx, body.model, "embed")
        finals = await _pool(ctx, raw, await _prompts(ctx, body), _params(body))
        data = [{"object": "embedding", "index": i, "embedding": _encode(f.pooler_output, body.encoding_format)}
                for i, f in enumerate(finals)]
        return _response("embd", model, data, finals)

    @app.post("/pooling", responses=_ERRORS)
    async def pooling(body: PoolingRequest, raw: Request) -> PoolingResponse:
        """vLLM's /pooling: the pooler's raw output per input."""
        model = _admit(ctx, body.model, None)
        finals = await _pool(ctx, raw, await _prompts(ctx, body), _params(body))
        data = [{"object": "pooling", "index": i, "data": _encode(f.pooler_output, body.encoding_format)}
                for i, f in enumerate(finals)]
        return _response("pool", model, data, finals)

    @app.post("/classify", responses=_ERRORS)
    async def classify(body: PoolingRequest, raw: Request) -> PoolingResponse:
        """vLLM's /classify: class probabilities and the most likely label per input."""
        model = _admit(ctx, body.model, "classify")
        finals = await _pool(ctx, raw, await _prompts(ctx, body), _params(body))
        labels = getattr(ctx.engine.config.model_config.hf_config, "id2label", None) or {}
        data = []
        for i, f in enumerate(finals):
            best = int(np.argmax(f.pooler_output))
            data.append({"object": "classification", "index": i, "probs": f.pooler_output,
                         "num_classes": len(f.pooler_output), "label": labels.get(best, str(best))})
        return _response("classify", model, data, finals)

    async def score(body: ScoreRequest, raw: Request) -> PoolingResponse:
        """vLLM's /score: text_1 against each text_2 (1 -> N, or N -> N)."""
        model = _admit(ctx, body.model, "score")
        finals, scores = await _scores(ctx, raw, body.text_1, body.text_2, body.truncate_prompt_tokens, "text_2")
        data = [{"object": "score", "index": i, "score": s} for i, s in enumerate(scores)]
        return _response("score", model, data, finals)

    async def rerank(body: RerankRequest, raw: Request) -> RerankResponse:
        """Jina's / Cohere's rerank: the documents by relevance to the query, best first, `top_n` of them."""
        model = _admit(ctx, body.model, "score")
        if not body.documents:
            raise bad_request("documents must not be empty.", param="documents")
        if body.top_n is not None and body.top_n < 1:
            raise bad_request(f"top_n must be >= 1; got {body.top_n}.", param="top_n")
        finals, scores = await _scores(ctx, raw, body.query, body.documents, body.truncate_prompt_tokens,
                                       "documents")
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:body.top_n or len(scores)]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": body.documents[i]}} if body.return_documents else {})} for i in order]
        tokens = sum(len(f.prompt_token_ids) for f in finals)
        return RerankResponse(id=f"rerank-{uuid.uuid4().hex}", model=model, usage={"total_tokens": tokens},
                              results=results)

    for path in ("/score", "/v1/score"):
        app.post(path, responses=_ERRORS)(score)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.post(path, responses=_ERRORS)(rerank)


def _admit(ctx: ServingContext, requested: str | None, task: str | None) -> str:
    """The model name; 400 naming the runner when the engine cannot serve `task` (None: any pooling task)."""
    model = ctx.model_name(requested)
    ctx.require_ready()
    pooler = ctx.engine.config.pooler_config
    if pooler is None:
        raise bad_request("This model runs the generate runner: it has no pooler (serve it with --runner pooling).",
                          param="model")
    allowed = {"embed": {"embed"}, "classify": {"classify"}, "score": {"embed", "classify"}}.get(task)
    if allowed is not None and pooler.task not in allowed:
        raise bad_request(f"This model runs runner 'pooling' with convert {pooler.task!r}, which does not serve "
                          f"{task}.", param="model")
    return model


async def _prompts(ctx: ServingContext, body: PoolingRequest) -> list[list[int]]:
    """`input` as token-id prompts: a string, a list of strings, token ids, or a list of token-id lists."""
    value = body.input
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
        value = [value]
    if not value:
        raise bad_request("input must not be empty.", param="input")
    prompts = []
    for item in value:
        if isinstance(item, str):
            if not item:
                raise bad_request("input must not contain an empty string.", param="input")
            prompts.append(await ctx.tokenize(item, add_special_tokens=body.add_special_tokens, param="input"))
        else:
            if not item:
                raise bad_request("input must not contain an empty token list.", param="input")
            prompts.append(ctx.check_token_ids(list(item), "input"))
    return prompts


def _params(body: PoolingRequest) -> PoolingParams:
    try:
        return PoolingParams(dimensions=body.dimensions, truncate_prompt_tokens=body.truncate_prompt_tokens)
    except ValueError as exc:
        raise bad_request(str(exc), param=str(exc).split(" ", 1)[0]) from exc


async def _pool(ctx: ServingContext, raw: Request, prompts: list[list[int]],
                params: PoolingParams) -> list[RequestOutput]:
    """Every prompt through the engine at once; their final outputs, in order."""
    request_id = uuid.uuid4().hex

    async def one(i: int, prompt: list[int]) -> RequestOutput:
        final = None
        async for out in ctx.engine.generate({"prompt_token_ids": prompt}, params, f"pool-{request_id}-{i}"):
            final = out
        if final is None or final.pooler_output is None:
            raise APIError(500, "The engine ended a pooling request without its output.", code="internal_error")
        return final

    async def run() -> list[RequestOutput]:
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    try:
        return await await_or_disconnect(run(), raw)
    except (ValueError, TypeError) as exc:
        raise bad_request(str(exc), param=_field_of(str(exc)), code="invalid_value") from exc
    except APIError:
        raise
    except Exception as exc:
        mapped = engine_error(exc, starting=True)
        if mapped is not None:
            raise mapped from exc
        raise


def _field_of(message: str) -> str:
    """The field an engine refusal names first ("dimensions: ...", "input: ..."), else input."""
    first = message.split(" ", 1)[0].rstrip(":")
    return first if first in ("dimensions", "truncate_prompt_tokens", "input") else "input"


async def _scores(ctx: ServingContext, raw: Request, left: str | list[str], right: str | list[str],
                  truncate: int | None, right_field: str) -> tuple[list[RequestOutput], list[float]]:
    """Scores of the pairs: an embedding model's cosines, a one-label classifier's pair probabilities."""
    try:
        lefts, rights = pair_up(left, right)
    except ValueError as exc:
        raise bad_request(str(exc), param=right_field) from exc
    params = _params(PoolingRequest(input="x", truncate_prompt_tokens=truncate))
    pooler, tokenizer = ctx.engine.config.pooler_config, ctx.engine.tokenizer
    if pooler.task == "classify":
        if pooler.num_labels != 1:
            raise bad_request(f"score needs an embedding model or a one-label classifier; this one has "
                              f"{pooler.num_labels} labels (use /classify).", param="model")
        prompts = [pair_token_ids(tokenizer, a, b) for a, b in zip(lefts, rights)]
        finals = await _pool(ctx, raw, prompts, params)
        return finals, [f.pooler_output[0] for f in finals]
    texts = [lefts[0]] + rights if len(set(lefts)) == 1 else lefts + rights
    prompts = []
    for text in texts:
        if not text:
            raise bad_request("texts to score must not be empty.", param=right_field)
        prompts.append(await ctx.tokenize(text, param=right_field))
    finals = await _pool(ctx, raw, prompts, params)
    vectors = [f.pooler_output for f in finals]
    firsts = [vectors[0]] * len(rights) if len(set(lefts)) == 1 else vectors[:len(lefts)]
    return finals, [cosine(a, b) for a, b in zip(firsts, vectors[-len(rights):])]


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def _response(kind: str, model: str, data: list[dict[str, Any]], finals: list[RequestOutput]) -> PoolingResponse:
    tokens = sum(len(f.prompt_token_ids) for f in finals)
    return PoolingResponse(id=f"{kind}-{uuid.uuid4().hex}", model=model, data=data,
                           usage=PoolingUsage(prompt_tokens=tokens, total_tokens=tokens))

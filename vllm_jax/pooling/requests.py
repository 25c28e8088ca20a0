"""The engine's part of the pooling runner: a request's checks on arrival, and the pooled vectors onto outputs.

A pooling engine takes PoolingParams only, a generation engine SamplingParams only: the other is a ValueError
naming the runner. A finished prompt's vector (ModelRunnerOutput.pooler_output) rides on its final RequestOutput
(`pooler_output`), so the offline LLM and AsyncLLM's streams deliver it unchanged
(docs/architecture/14-pooling.md, "A pooling request").
"""

from __future__ import annotations

from vllm_jax.config import EngineConfig
from vllm_jax.outputs import RequestOutput
from vllm_jax.pooling_params import PoolingParams, truncate_prompt
from vllm_jax.sampling_params import SamplingParams


def runner_name(config: EngineConfig) -> str:
    pooler = config.pooler_config
    return "generate" if pooler is None else f"pooling (convert {pooler.task!r})"


def check_pooling_request(config: EngineConfig, params: SamplingParams, token_ids: list[int],
                          hidden_size: int) -> list[int]:
    """The prompt the request runs (truncated as it asks); a ValueError naming the runner for the wrong kind of
    request, or naming the field."""
    pooler, pooling = config.pooler_config, isinstance(params, PoolingParams)
    if pooler is None and pooling:
        raise ValueError("this model runs the generate runner: it has no pooler (start it with runner='pooling' "
                         "for embed / classify / score)")
    if pooler is None:
        return token_ids
    if not pooling:
        raise ValueError(f"this model runs runner {runner_name(config)}: it generates no text; use embed, classify, "
                         "score or encode")
    pooler.check_dimensions(params.dimensions, hidden_size)
    max_len = config.model_config.max_model_len
    token_ids = truncate_prompt(token_ids, params.truncate_prompt_tokens, max_len)
    if not token_ids:
        raise ValueError("input: the prompt is empty")
    if len(token_ids) >= max_len:
        raise ValueError(f"input: the prompt has {len(token_ids)} tokens, more than this model's "
                         f"{max_len - 1} (max_model_len - 1); set truncate_prompt_tokens to keep its last tokens")
    return token_ids


def attach_pooler_outputs(outputs: list[RequestOutput], pooled: dict[str, list[float]]) -> None:
    for out in outputs:
        vector = pooled.get(out.request_id)
        if vector is not None:
            out.pooler_output = vector

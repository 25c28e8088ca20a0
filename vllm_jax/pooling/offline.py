"""The offline pooling API, vLLM's: `LLM.encode`, `.embed`, `.classify`, `.score` on a pooling runner.

A mixin of `LLM`: each call turns its prompts into pooling requests (PoolingParams) and runs them through
`LLM._run` like `generate`; the vectors come back on the final RequestOutputs (docs/pooling.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_jax.outputs import (
    ClassificationOutput,
    EmbeddingOutput,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
)
from vllm_jax.pooling_params import PoolingParams, cosine, pair_token_ids, pair_up

_TASK_OUTPUTS = {"embed": EmbeddingOutput, "classify": ClassificationOutput, "reward": PoolingOutput}


class PoolingMixin:
    """Needs `llm_engine`, `_prompt_list(prompts)` and `_run(prompts, params, use_tqdm)` (LLM's); it imports
    nothing of llm.py, which imports it."""

    llm_engine: Any

    def encode(self, prompts: Any, pooling_params: PoolingParams | Sequence[PoolingParams] | None = None, *,
               truncate_prompt_tokens: int | None = None, use_tqdm: bool = True,
               pooling_task: str | None = None) -> list[PoolingRequestOutput]:
        """The pooler's raw output per prompt (`.outputs.data`)."""
        outs = self._pool(prompts, pooling_params, truncate_prompt_tokens, use_tqdm, pooling_task)
        return [_typed(out, PoolingOutput(out.pooler_output)) for out in outs]

    def embed(self, prompts: Any, pooling_params: PoolingParams | Sequence[PoolingParams] | None = None, *,
              truncate_prompt_tokens: int | None = None, use_tqdm: bool = True) -> list[PoolingRequestOutput]:
        """One embedding per prompt (`.outputs.embedding`); needs convert 'embed'."""
        outs = self._pool(prompts, pooling_params, truncate_prompt_tokens, use_tqdm, "embed")
        return [_typed(out, EmbeddingOutput(out.pooler_output)) for out in outs]

    def classify(self, prompts: Any, pooling_params: PoolingParams | Sequence[PoolingParams] | None = None, *,
                 truncate_prompt_tokens: int | None = None, use_tqdm: bool = True) -> list[PoolingRequestOutput]:
        """The class probabilities per prompt (`.outputs.probs`); needs a classifier (convert 'classify')."""
        outs = self._pool(prompts, pooling_params, truncate_prompt_tokens, use_tqdm, "classify")
        return [_typed(out, ClassificationOutput(out.pooler_output)) for out in outs]

    def score(self, data_1: str | Sequence[str], data_2: str | Sequence[str], /, *,
              truncate_prompt_tokens: int | None = None, use_tqdm: bool = True) -> list[PoolingRequestOutput]:
        """vLLM's score: one `data_1` against each `data_2` (or pairwise, equal lengths). An embedding model
        scores the cosine of the two embeddings; a one-label classifier (a cross-encoder) the pair's
        probability, the two texts tokenized as a pair."""
        left, right = pair_up(data_1, data_2)
        pooler = self.llm_engine.config.pooler_config
        params = PoolingParams(truncate_prompt_tokens=truncate_prompt_tokens)
        if pooler is not None and pooler.task == "classify":
            if pooler.num_labels != 1:
                raise ValueError(f"score needs an embedding model or a one-label classifier; this classifier has "
                                 f"{pooler.num_labels} labels (use classify)")
            prompts = [{"prompt_token_ids": pair_token_ids(self.llm_engine.tokenizer, a, b)}
                       for a, b in zip(left, right)]
            outs = self._pool(prompts, params, None, use_tqdm, "classify")
            return [_typed(out, ScoringOutput(out.pooler_output[0])) for out in outs]
        broadcast = len(set(left)) == 1  # 1 -> N: the first text is embedded once
        outs = self._pool(left[:1] + right if broadcast else left + right, params, None, use_tqdm, "embed")
        firsts = outs[:1] * len(right) if broadcast else outs[:len(left)]
        return [_typed(b, ScoringOutput(cosine(a.pooler_output, b.pooler_output)))
                for a, b in zip(firsts, outs[-len(right):])]

    def _pool(self, prompts: Any, params: PoolingParams | Sequence[PoolingParams] | None,
              truncate_prompt_tokens: int | None, use_tqdm: bool, task: str | None) -> list[RequestOutput]:
        pooler = self.llm_engine.config.pooler_config
        if pooler is None:
            raise ValueError(f"{task or 'encode'} needs a pooling model: this LLM runs the generate runner "
                             "(start it with runner='pooling')")
        if task is not None and task != pooler.task and not (task == "embed" and pooler.task == "reward"):
            raise ValueError(f"{task} is not supported by this model: it runs runner 'pooling' with convert "
                             f"{pooler.task!r}")
        prompt_list = self._prompt_list(prompts)
        if isinstance(params, Sequence):
            params_list = list(params)
            if len(params_list) != len(prompt_list):
                raise ValueError(f"got {len(params_list)} pooling params for {len(prompt_list)} prompts")
        else:
            params_list = [params or PoolingParams()] * len(prompt_list)
        if truncate_prompt_tokens is not None:
            params_list = [_with_truncation(p, truncate_prompt_tokens) for p in params_list]
        return self._run(prompt_list, params_list, use_tqdm)


def _with_truncation(params: PoolingParams, truncate: int) -> PoolingParams:
    params = params.clone()
    params.truncate_prompt_tokens = truncate
    return params


def _typed(out: RequestOutput, outputs: Any) -> PoolingRequestOutput:
    return PoolingRequestOutput(request_id=out.request_id, outputs=outputs, prompt_token_ids=out.prompt_token_ids,
                                finished=out.finished)

"""Engine logprobs (one `{token_id: Logprob}` dict per sampled token, the sampled token first) in OpenAI's shapes.

Completions (legacy): parallel lists `tokens`, `token_logprobs`, `top_logprobs` (a `{token: logprob}` dict of
the sampled token plus the top N, so up to N + 1 entries, as OpenAI documents) and `text_offset` (where each
token's text starts in the choice's text). An echoed prompt's tokens come first, scored by the engine's prompt
logprobs; its first token has nothing before it, so its logprob and top_logprobs are null, as in vLLM.
Chat: `content: [{token, logprob, bytes, top_logprobs: [...]}]` with exactly the top N alternatives. -inf
becomes -9999.0, as in vLLM, because JSON has no infinity.
"""

from __future__ import annotations

import math
from itertools import islice
from typing import Any

from vllm_jax.outputs import Logprob
from vllm_jax.server.responses import ChatLogprob, CompletionLogProbs, PromptLogprob, PromptLogprobs, TopLogprob

_MIN_LOGPROB = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else _MIN_LOGPROB


def token_text(token_id: int, lp: Logprob | None, tokenizer: Any) -> str:
    """The token's text: what the engine decoded, else a decode of the id alone."""
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([token_id]) if tokenizer is not None else ""


def completion_logprobs(token_ids: list[int], logprobs: list[dict[int, Logprob] | None], top_n: int,
                        tokenizer: Any, text_offset: int) -> tuple[CompletionLogProbs, int]:
    """Legacy logprobs for these tokens, with offsets starting at `text_offset`; returns the next offset too.

    `top_logprobs` keeps a position's first top_n + 1 entries (the token, then its alternatives): an echoed
    prompt may have been scored with a wider `prompt_logprobs`. A position without scores gets nulls."""
    out = CompletionLogProbs()
    for token_id, step in zip(token_ids, logprobs, strict=True):
        lp = step.get(token_id) if step is not None else None
        text = token_text(token_id, lp, tokenizer)
        out.tokens.append(text)
        out.token_logprobs.append(_finite(lp.logprob) if lp is not None else None)
        out.top_logprobs.append(None if step is None else {
            token_text(t, x, tokenizer): _finite(x.logprob) for t, x in islice(step.items(), top_n + 1)})
        out.text_offset.append(text_offset)
        text_offset += len(text)
    return out, text_offset


def chat_logprobs(token_ids: list[int], logprobs: list[dict[int, Logprob]], top_n: int,
                  tokenizer: Any) -> list[ChatLogprob]:
    """Chat logprobs: the sampled token and its `top_n` most likely alternatives at each position."""
    content = []
    for token_id, step in zip(token_ids, logprobs):
        lp = step.get(token_id)
        text = token_text(token_id, lp, tokenizer)
        ranked = sorted(step.items(), key=lambda item: -item[1].logprob)[:top_n]
        top = [TopLogprob(token=(t_text := token_text(t, x, tokenizer)), logprob=_finite(x.logprob),
                          bytes=list(t_text.encode("utf-8", "replace")))
               for t, x in ranked]
        content.append(ChatLogprob(token=text, logprob=_finite(lp.logprob) if lp is not None else _MIN_LOGPROB,
                                   bytes=list(text.encode("utf-8", "replace")), top_logprobs=top))
    return content


def prompt_logprobs(entries: list[dict[int, Logprob] | None] | None) -> PromptLogprobs | None:
    """vLLM's `prompt_logprobs` field: per prompt position, token id (as a JSON key) -> logprob, rank, text."""
    if entries is None:
        return None
    return [None if step is None else {
        str(t): PromptLogprob(logprob=_finite(x.logprob), rank=x.rank, decoded_token=x.decoded_token)
        for t, x in step.items()} for step in entries]

"""The runner's per-row output: a row's sampled token and logprobs as the engine reports them, and the prompt
logprobs of a step's scored rows (ModelRunner.finish turns a step's fetched result into these)."""

from __future__ import annotations

import numpy as np

from vllm_jax.sample.sampler import SamplerOutput
from vllm_jax.worker.request_state import CachedRequestState

Logprobs = tuple[list[int], list[float], list[int]]  # token ids, logprobs, ranks: the sampled token, then top-N


def plain_tokens(states: dict[str, CachedRequestState], req_ids: list[str], tokens: list[int],
                 update: list[bool]) -> tuple[list[list[int]], list[None]]:
    """`ModelRunner._single_tokens` where every row samples and the step computed no logprobs: the per-row work
    left is the state's append."""
    for req_id, token_id, updates in zip(req_ids, tokens, update):
        if updates:  # CachedRequestState.append_sampled, inlined: once per row per step
            state = states[req_id]
            state.token_ids.append(token_id)
            state.output_token_ids.append(token_id)
    return [[token_id] for token_id in tokens], [None] * len(tokens)


def row_logprobs(out: SamplerOutput, row: int, num_logprobs: int | None) -> Logprobs | None:
    """The row's sampled token then its top-`num_logprobs` (the step computed the widest any row asked)."""
    if num_logprobs is None or out.logprobs is None:
        return None
    width = 1 + num_logprobs
    return (out.logprob_token_ids[row, :width].tolist(), out.logprobs[row, :width].tolist(),
            out.ranks[row, :width].tolist())


def prompt_logprobs(arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                    spans: dict[str, tuple[int, int, int]]) -> dict[str, list[Logprobs]]:
    if arrays is None:
        return {}
    ids, lps, ranks = arrays
    return {req_id: [(ids[j, :1 + k].tolist(), lps[j, :1 + k].tolist(), ranks[j, :1 + k].tolist())
                     for j in range(first, first + count)] for req_id, (first, count, k) in spans.items()}

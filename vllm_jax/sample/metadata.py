"""Host-side builder of the sampler's per-step inputs: requests' SamplingParams -> padded numpy SamplingTensors.

Two variants keep the common case cheap. The basic variant is six [S] arrays (no [S, V] work at all). The full
variant adds [S, V] logit_bias / prompt_mask / output_counts, per-row penalties and the structured-output bitmask
[S, ceil(V / 32)]; it is built only when some row needs penalties, logit_bias, allowed_token_ids, bad words,
min_tokens masking or a grammar's bitmask in this step, and only those rows are filled (the others keep neutral
values: a free row's bitmask is all ones). The full variant's arrays go to the logits processors' program, and
both variants then share the sampling program (docs/architecture/08-sampling.md, "Sampling").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vllm_jax.sample.sampler import SamplingTensors
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.utils import bitmask_width

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF

NO_LOGPROBS = -1  # build_sampling_tensors' num_logprobs when no row asked for logprobs


@dataclass(slots=True)
class RowSamplingInput:
    """One batch row: the request's params, its seed (always set: random at arrival when the user gave none),
    its tokens so far, and the position of the token being sampled (the RNG counter)."""

    sampling_params: SamplingParams
    seed: int
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    position: int
    token_bitmask: np.ndarray | None = None  # [ceil(V / 32)] int32 from the request's grammar, None: free


def seed_to_uint32(seed: int) -> int:
    """Fold a Python int (any sign, up to 64 bits significant) into uint32; seeds in [0, 2**32) map to themselves."""
    s = seed & _MASK64
    return (s ^ (s >> 32)) & _MASK32


def build_sampling_tensors(rows: Sequence[RowSamplingInput], num_rows_padded: int,
                           vocab_size: int) -> tuple[SamplingTensors, int]:
    """Padded numpy SamplingTensors for `rows` (`is_full` tells the variant), and the max logprobs asked.

    Padding rows are greedy with neutral params. num_logprobs is the largest `logprobs` over rows, or NO_LOGPROBS
    (-1) when no row asked (0 is a real request: the sampled token's logprob only).
    """
    n = len(rows)
    if n > num_rows_padded:
        raise ValueError(f"{n} rows do not fit in num_rows_padded={num_rows_padded}")
    temperature = np.zeros(num_rows_padded, np.float32)
    top_p = np.ones(num_rows_padded, np.float32)
    top_k = np.zeros(num_rows_padded, np.int32)
    min_p = np.zeros(num_rows_padded, np.float32)
    seeds = np.zeros(num_rows_padded, np.uint32)
    positions = np.zeros(num_rows_padded, np.int32)
    num_logprobs = NO_LOGPROBS
    full_rows: list[int] = []
    if n:
        params = [r.sampling_params for r in rows]
        temperature[:n] = [p.temperature for p in params]
        top_p[:n] = [p.top_p for p in params]
        top_k[:n] = [p.top_k if p.top_k < vocab_size else 0 for p in params]  # k >= vocab keeps every token
        min_p[:n] = [p.min_p for p in params]
        seeds[:n] = [seed_to_uint32(r.seed) for r in rows]
        positions[:n] = [r.position for r in rows]
        num_logprobs = max((p.logprobs for p in params if p.logprobs is not None), default=NO_LOGPROBS)
        full_rows = [i for i, r in enumerate(rows) if _needs_full(r)]
    tensors = SamplingTensors(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seeds=seeds,
                              positions=positions)
    if not full_rows:
        return tensors, num_logprobs
    return _add_full(tensors, rows, full_rows, num_rows_padded, vocab_size), num_logprobs


def _needs_full(row: RowSamplingInput) -> bool:
    p = row.sampling_params
    return bool(
        _has_penalties(p)
        or p.logit_bias
        or p.allowed_token_ids is not None
        or p.bad_words_token_ids
        or _min_tokens_active(row)
        or row.token_bitmask is not None
    )


def may_need_full(p: SamplingParams) -> bool:
    """Whether some step of a request with these params may need the full variant (a grammar's bitmask aside):
    a superset of `_needs_full`, fixed for the request's life, so a runner can check it once at arrival."""
    return bool(_has_penalties(p) or p.logit_bias or p.allowed_token_ids is not None or p.bad_words_token_ids
                or p.min_tokens > 0)


def _has_penalties(p: SamplingParams) -> bool:
    return p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0


def _min_tokens_active(row: RowSamplingInput) -> bool:
    """vLLM masks every stop id (EOS included, even with ignore_eos) until min_tokens outputs exist."""
    p = row.sampling_params
    return p.min_tokens > 0 and len(row.output_token_ids) < p.min_tokens and bool(
        p.all_stop_token_ids or p.stop_token_ids)


def _add_full(tensors: SamplingTensors, rows: Sequence[RowSamplingInput], full_rows: list[int],
              num_rows_padded: int, vocab_size: int) -> SamplingTensors:
    shape = (num_rows_padded, vocab_size)
    logit_bias = np.zeros(shape, np.float32)
    prompt_mask = np.zeros(shape, np.bool_)
    output_counts = np.zeros(shape, np.int32)
    presence = np.zeros(num_rows_padded, np.float32)
    frequency = np.zeros(num_rows_padded, np.float32)
    repetition = np.ones(num_rows_padded, np.float32)
    token_bitmask = np.full((num_rows_padded, bitmask_width(vocab_size)), -1, np.int32)
    for i in full_rows:
        row = rows[i]
        p = row.sampling_params
        if row.token_bitmask is not None:
            token_bitmask[i] = row.token_bitmask
        _fill_bias(logit_bias[i], row, vocab_size)
        if _has_penalties(p):
            presence[i], frequency[i], repetition[i] = p.presence_penalty, p.frequency_penalty, p.repetition_penalty
            if len(row.output_token_ids):
                counts = np.bincount(np.asarray(row.output_token_ids, np.int64), minlength=vocab_size)
                output_counts[i] = counts[:vocab_size]
            if p.repetition_penalty != 1.0 and len(row.prompt_token_ids):
                prompt_mask[i, np.asarray(row.prompt_token_ids, np.int64)] = True
    return SamplingTensors(
        temperature=tensors.temperature, top_p=tensors.top_p, top_k=tensors.top_k, min_p=tensors.min_p,
        seeds=tensors.seeds, positions=tensors.positions, logit_bias=logit_bias, prompt_mask=prompt_mask,
        output_counts=output_counts, presence_penalties=presence, frequency_penalties=frequency,
        repetition_penalties=repetition, token_bitmask=token_bitmask)


def _fill_bias(bias: np.ndarray, row: RowSamplingInput, vocab_size: int) -> None:
    """One row's additive bias: -inf outside allowed_token_ids, on banned bad-word tokens and (while min_tokens
    is unmet) on stop ids; plus the user's logit_bias (which cannot lift a -inf)."""
    p = row.sampling_params
    if p.allowed_token_ids is not None:
        bias[:] = -np.inf
        bias[np.asarray(p.allowed_token_ids, np.int64)] = 0.0
    for token_id in banned_bad_word_tokens(p.bad_words_token_ids, row.output_token_ids):
        bias[token_id] = -np.inf
    if _min_tokens_active(row):
        stop_ids = [t for t in p.all_stop_token_ids | set(p.stop_token_ids) if 0 <= t < vocab_size]
        bias[np.asarray(stop_ids, np.int64)] = -np.inf
    if p.logit_bias:
        ids = np.fromiter(p.logit_bias.keys(), np.int64, len(p.logit_bias))
        values = np.fromiter(p.logit_bias.values(), np.float32, len(p.logit_bias))
        bias[ids] += values


def banned_bad_word_tokens(bad_words_token_ids: Sequence[Sequence[int]], output_token_ids: Sequence[int]) -> set[int]:
    """vLLM's rule: ban a bad word's last token when the output so far ends with the word's other tokens
    (single-token bad words are always banned)."""
    banned: set[int] = set()
    num_out = len(output_token_ids)
    for word in bad_words_token_ids:
        prefix_len = len(word) - 1
        if prefix_len < 0 or prefix_len > num_out:
            continue
        if prefix_len == 0 or list(output_token_ids[num_out - prefix_len:]) == list(word[:prefix_len]):
            banned.add(word[-1])
    return banned

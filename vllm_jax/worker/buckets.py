"""Padding buckets: the fixed (tokens, sequences) shapes the jitted step is compiled for."""

from __future__ import annotations

import bisect


def geometric_buckets(minimum: int, maximum: int, growth: int = 2) -> list[int]:
    """minimum, growth*minimum, ... up to and including maximum (which need not be on the progression)."""
    buckets, b = [], max(1, minimum)
    while b < maximum:
        buckets.append(b)
        b *= growth
    buckets.append(maximum)
    return buckets


def pick_bucket(buckets: list[int], n: int) -> int:
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]


def max_step_rows(max_num_seqs: int, max_num_batched_tokens: int, num_spec_tokens: int = 0,
                  spec_batch_limit: int | None = None) -> int:
    """The most rows (logits rows) one step can hold: a row per request, plus one per speculative proposal.

    Every logits row is one of the step's tokens, so they never exceed max_num_batched_tokens; proposals come
    only while at most `spec_batch_limit` requests run (disable_by_batch_size; None: always), k per request.
    Never below max_num_seqs, so an engine's buckets up to there are the same with speculation as without
    (docs/architecture/05-worker.md, "The step's arrays").
    """
    proposing = max_num_seqs if spec_batch_limit is None else min(max_num_seqs, spec_batch_limit)
    return max(max_num_seqs, min(max_num_batched_tokens, max_num_seqs + proposing * num_spec_tokens))


def seq_bucket_for(token_bucket: int, seq_buckets: list[int], max_rows: int) -> int:
    """The one sequence bucket paired with a token bucket.

    A batch of T tokens has at most min(T, max_rows) rows (`max_step_rows`), so that many rows always suffice;
    tying S to T keeps one compiled program per token bucket instead of one per (T, S) pair. The cost is a few
    padding rows in the LM head, whose weights are read once per step whatever the row count.
    """
    return pick_bucket(seq_buckets, min(token_bucket, max_rows))

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


def seq_bucket_for(token_bucket: int, seq_buckets: list[int], max_num_seqs: int) -> int:
    """The one sequence bucket paired with a token bucket.

    A batch of T tokens has at most min(T, max_num_seqs) rows, so that many rows always suffice; tying S to T
    keeps one compiled program per token bucket instead of one per (T, S) pair. The cost is a few padding
    rows in the LM head, whose weights are read once per step whatever the row count.
    """
    return pick_bucket(seq_buckets, min(token_bucket, max_num_seqs))

"""Small arithmetic shared across parts of the package (a leaf module: it imports nothing of ours)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many size-`b` pieces hold `a` items (blocks for tokens, tiles for rows)."""
    return -(-a // b)


def bitmask_width(vocab_size: int) -> int:
    """int32 words per structured-output bitmask row: one bit per token of the logits' width."""
    return cdiv(vocab_size, 32)

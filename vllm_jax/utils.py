"""Small helpers shared across parts of the package (a leaf module: it imports nothing of ours)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many size-`b` pieces hold `a` items (blocks for tokens, tiles for rows)."""
    return -(-a // b)


def bitmask_width(vocab_size: int) -> int:
    """int32 words per structured-output bitmask row: one bit per token of the logits' width."""
    return cdiv(vocab_size, 32)


def partial_marker_len(text: str, marker: str) -> int:
    """How many trailing characters of `text` could be the start of `marker` (at most len(marker) - 1).

    A stream parser holds those back: the next delta decides whether they open the marker or are plain text."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def json_object_flag(name: str, value: str | dict, known: set[str] | tuple[str, ...] | None = None) -> dict:
    """A JSON-object flag (its JSON text, or a dict offline) as a dict whose keys are all `known` (any key when
    None); a ValueError naming the flag otherwise."""
    import json

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} must be a JSON object; got {value!r} ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object; got {value!r}")
    unknown = sorted(set(value) - set(known)) if known is not None else []
    if unknown:
        raise ValueError(f"{name}: unknown keys {unknown}; known: {sorted(known)}")
    return value

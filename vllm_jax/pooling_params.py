"""PoolingParams: vLLM's per-request pooling options (dimensions, truncate_prompt_tokens).

A pooling request runs through the same scheduler and engine loop as a generation request: prefill only, its
request finishing when its prompt's last chunk has run (docs/architecture/14-pooling.md, "A pooling request"). So
PoolingParams is a SamplingParams whose generation part is fixed (one greedy step that nobody reads), carrying the
pooling options to the runner's pooler.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm_jax.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class PoolingParams(SamplingParams):
    # Matryoshka: keep the first `dimensions` entries of the embedding, then normalize (None: all of them)
    dimensions: int | None = None
    # keep only the prompt's last k tokens (-1: the last max_model_len), as vLLM; None: refuse a too-long prompt
    truncate_prompt_tokens: int | None = None
    temperature: float = 0.0
    max_tokens: int | None = 1
    detokenize: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("dimensions", "truncate_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be an integer; got {value!r}")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be >= 1; got {self.dimensions}")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < -1:
            raise ValueError(f"truncate_prompt_tokens must be -1 or >= 0; got {self.truncate_prompt_tokens}")
        if self.max_tokens != 1 or self.n != 1:
            raise ValueError("a pooling request runs its prompt once: max_tokens 1, n 1")


def truncate_prompt(token_ids: list[int], truncate: int | None, max_model_len: int) -> list[int]:
    """The prompt's last `truncate` tokens (-1: the last max_model_len - 1, the longest prompt the engine runs);
    None keeps it whole."""
    if truncate is None:
        return token_ids
    keep = max_model_len - 1 if truncate == -1 else truncate
    if keep > max_model_len - 1:
        raise ValueError(f"truncate_prompt_tokens ({keep}) must be at most max_model_len - 1 ({max_model_len - 1})")
    return token_ids[-keep:] if keep else []


def pair_up(data_1: str | Sequence[str], data_2: str | Sequence[str]) -> tuple[list[str], list[str]]:
    """vLLM's score pairing: 1 -> N broadcasts the first text, N -> N pairs them; a ValueError otherwise."""
    left = [data_1] if isinstance(data_1, str) else list(data_1)
    right = [data_2] if isinstance(data_2, str) else list(data_2)
    if not left or not right:
        raise ValueError("score needs at least one text on each side")
    if len(left) == 1:
        left = left * len(right)
    if len(left) != len(right):
        raise ValueError(f"score pairs 1 text with N, or N with N; got {len(left)} and {len(right)}")
    return left, right


def pair_token_ids(tokenizer: Any, text_1: str, text_2: str) -> list[int]:
    """A cross-encoder's input: the two texts as the tokenizer encodes a pair."""
    return list(tokenizer(text_1, text_pair=text_2)["input_ids"])


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0

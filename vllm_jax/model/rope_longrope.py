"""LongRoPE (Phi-3 `rope_type` "longrope"): per-frequency rescaling by `short_factor` or `long_factor`, and a
cos/sin multiplier (docs/architecture/12-families.md, "LongRoPE: short or long factors").

inv_freq_i = 1 / (factor_i * theta ** (2i / dim)), as transformers computes it (float32). The attention factor
multiplies cos and sin: `attention_factor` when given, else sqrt(1 + ln(s) / ln(original)) for s =
`factor` or max_position_embeddings / original_max_position_embeddings (1.0 when s <= 1); the same for both
factor sets.

Which set: transformers picks per forward call (the long set when the largest position + 1 exceeds
`original_max_position_embeddings`), so one sequence's keys can be rotated with either set depending on how
it was chunked. Here the choice is fixed per engine, as in vLLM: every token uses the long factors when the
context the engine serves (max_model_len) exceeds the original one, else the short ones
(`DecoderSpec.for_context`, model/spec.py). Stateless and the same for every token, so prefix caching, chunking
and preemption cannot change a result.
"""

from __future__ import annotations

import math

import numpy as np


def longrope_inv_freq(rope: dict, head_dim: int, which: str = "short") -> tuple[np.ndarray, float]:
    """(inverse frequencies with the `which` ("short" / "long") factors, cos/sin multiplier) for HF rope
    parameters holding `rope_theta`, `short_factor`, `long_factor`, `original_max_position_embeddings` and
    `factor` or `max_position_embeddings` (added by spec.rope_parameters_of)."""
    dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    factors = np.asarray(rope[f"{which}_factor"], dtype=np.float32)
    if factors.shape != (dim // 2,):
        raise ValueError(f"longrope {which}_factor has {factors.size} entries; the rotary dim {dim} needs "
                         f"{dim // 2}")
    base = float(rope["rope_theta"])
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim
    inv_freq = (1.0 / (factors * np.float32(base) ** exponents)).astype(np.float32)
    return inv_freq, attention_factor(rope)


def attention_factor(rope: dict) -> float:
    """The cos/sin multiplier: `attention_factor`, else sqrt(1 + ln(factor) / ln(original context))."""
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    original = original_context(rope)
    factor = rope.get("factor")
    if factor is None:
        if rope.get("max_position_embeddings") is None:
            raise ValueError("longrope needs `factor` or the config's max_position_embeddings")
        factor = rope["max_position_embeddings"] / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def original_context(rope: dict) -> int:
    original = rope.get("original_max_position_embeddings")
    if not original:
        raise ValueError("longrope needs original_max_position_embeddings")
    return int(original)

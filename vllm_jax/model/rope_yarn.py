"""YaRN rotary scaling (`rope_type: yarn`: gpt-oss, DeepSeek-V3, Qwen long-context configs), as transformers'
`_compute_yarn_parameters` computes it: a per-frequency blend of the original (extrapolated) and the
`factor`-interpolated inverse frequencies over a linear ramp between the correction dims of `beta_fast` and
`beta_slow` rotations, and an attention factor that multiplies cos and sin. Float32 like transformers, so the
tables match it bit for bit up to pow's rounding (docs/architecture/12-families.md, "gpt-oss").
"""

from __future__ import annotations

import math

import numpy as np


def yarn_inv_freq(rope: dict, head_dim: int) -> tuple[np.ndarray, float]:
    """(inverse frequencies [dim / 2] float32, attention factor) for HF yarn rope parameters.

    Keys: rope_theta, factor (None: max_position_embeddings / original_max_position_embeddings, DeepSeek's
    convention), original_max_position_embeddings, beta_fast (32), beta_slow (1), truncate (True),
    attention_factor (None: derived from factor, with mscale / mscale_all_dim when both are set),
    partial_rotary_factor (1.0).
    """
    dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    base = float(rope["rope_theta"])
    original = rope.get("original_max_position_embeddings")
    if original is None:
        raise ValueError("rope_type 'yarn' needs original_max_position_embeddings in rope_parameters")
    factor = rope.get("factor")
    if factor is None:
        if rope.get("max_position_embeddings") is None:
            raise ValueError("rope_type 'yarn' without a factor needs max_position_embeddings")
        factor = rope["max_position_embeddings"] / original
    factor = float(factor)
    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
        else:
            attention_factor = _mscale(factor)
    beta_fast = rope.get("beta_fast") or 32
    beta_slow = rope.get("beta_slow") or 1
    truncate = rope.get("truncate", True)
    low = _correction_dim(beta_fast, dim, base, original)
    high = _correction_dim(beta_slow, dim, base, original)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)

    pos_freqs = np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    extrapolation = np.float32(1.0) / pos_freqs
    interpolation = np.float32(1.0) / (np.float32(factor) * pos_freqs)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolation_factor = np.float32(1.0) - ramp.astype(np.float32)
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq.astype(np.float32), float(attention_factor)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _correction_dim(num_rotations: float, dim: int, base: float, max_positions: int) -> float:
    """The dimension whose wavelength makes `num_rotations` turns over the original context."""
    return (dim * math.log(max_positions / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

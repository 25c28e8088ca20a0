"""Rotary inverse frequencies for HF-style rope parameters, as transformers computes them (float32): one
dispatch over `rope_type`, the Llama 3.1 scaling here, LongRoPE and YaRN in their own modules. Pure numpy, read once
when a spec is built (the per-step cos/sin tables are layers.rotary_tables)."""

from __future__ import annotations

import numpy as np

from vllm_jax.model.rope_longrope import longrope_inv_freq
from vllm_jax.model.rope_yarn import yarn_inv_freq


def rope_inv_freq(rope: dict, head_dim: int) -> tuple[np.ndarray, float]:
    """(inverse frequencies, cos/sin multiplier) as transformers computes them (float32) for HF-style rope
    parameters (`rope_theta`, `rope_type` and that type's keys)."""
    dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    base = float(rope["rope_theta"])
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    rope_type = rope["rope_type"]
    if rope_type == "default":
        return inv_freq.astype(np.float32), 1.0
    if rope_type == "linear":
        return (inv_freq / float(rope["factor"])).astype(np.float32), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope).astype(np.float32), 1.0
    if rope_type == "longrope":  # the short factors; spec.long_inv_freq holds the long (model/rope_longrope.py)
        return longrope_inv_freq(rope, head_dim)
    if rope_type == "yarn":
        return yarn_inv_freq(rope, head_dim)
    raise ValueError(f"rope_type {rope_type!r} is not supported yet (supported: default, linear, llama3, longrope, "
                     "yarn)")


def _llama3_inv_freq(inv_freq: np.ndarray, rope: dict) -> np.ndarray:
    """Llama 3.1 frequency-dependent scaling: long wavelengths divided by `factor`, short kept, smooth between."""
    factor = float(rope["factor"])
    low_freq_factor = float(rope["low_freq_factor"])
    high_freq_factor = float(rope["high_freq_factor"])
    old_context = float(rope["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * np.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(medium, smoothed, scaled)

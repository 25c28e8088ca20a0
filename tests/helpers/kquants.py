"""Q4_K and Q6_K blocks for test GGUF files: gguf-py dequantizes K-quants but cannot quantize them.

A plain round-to-nearest encoder (not llama.cpp's search for the best scales): the tests only need valid blocks
whose dequantized weights stay near the originals. Layouts as gguf-py's dequantize_blocks reads them.
"""

from __future__ import annotations

import numpy as np

QK = 256  # weights per super-block


def _super_blocks(array: np.ndarray) -> np.ndarray:
    rows, cols = array.shape
    if cols % QK:
        raise ValueError(f"K-quants need rows of a multiple of {QK} weights, got {cols}")
    return array.astype(np.float32).reshape(rows, cols // QK, QK)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast_shapes(a.shape, b.shape), np.float32), where=b != 0)


def q4_k_blocks(array: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> [rows, cols // 256 * 144] uint8 Q4_K blocks."""
    x = _super_blocks(array)
    sub = x.reshape(*x.shape[:2], 8, 32)
    minimum = np.maximum(0.0, -sub.min(-1))  # w = d * sc * q - dmin * m, q in 0..15, m >= 0
    scale = (sub.max(-1) + minimum) / 15.0
    d = (scale.max(-1, keepdims=True) / 63.0).astype(np.float16)
    dmin = (minimum.max(-1, keepdims=True) / 63.0).astype(np.float16)
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32))), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_safe_div(minimum, dmin.astype(np.float32))), 0, 63).astype(np.uint8)
    step = d.astype(np.float32) * sc
    offset = (dmin.astype(np.float32) * m)[..., None]
    q = np.clip(np.rint(_safe_div(sub + offset, step[..., None])), 0, 15).astype(np.uint8)  # [r, n, 8, 32]
    packed_scales = np.concatenate([
        sc[..., :4] | ((sc[..., 4:] >> 4) << 6),
        m[..., :4] | ((m[..., 4:] >> 4) << 6),
        (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)], axis=-1)
    qs = (q[..., 0::2, :] | (q[..., 1::2, :] << 4)).reshape(*x.shape[:2], 128)
    out = np.concatenate([d.view(np.uint8).reshape(*x.shape[:2], 2), dmin.view(np.uint8).reshape(*x.shape[:2], 2),
                          packed_scales, qs], axis=-1)
    return out.reshape(x.shape[0], -1)


def q6_k_blocks(array: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> [rows, cols // 256 * 210] uint8 Q6_K blocks."""
    x = _super_blocks(array)
    lead = x.shape[:2]
    sub = x.reshape(*lead, 16, 16)
    scale = np.abs(sub).max(-1) / 31.0
    d = (scale.max(-1, keepdims=True) / 127.0).astype(np.float16)
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32))), -128, 127).astype(np.int8)
    step = d.astype(np.float32) * sc
    q = (np.clip(np.rint(_safe_div(sub, step[..., None])), -32, 31) + 32).astype(np.uint8).reshape(*lead, 2, 128)
    low = q & 15  # element k of half a: low nibble of ql[64a + k % 64], shifted by 4 * (k // 64)
    ql = low[..., :64] | (low[..., 64:] << 4)
    high = (q >> 4).reshape(*lead, 2, 4, 32)  # high 2 bits: qh[32a + k % 32], shifted by 2 * (k // 32)
    qh = high[..., 0, :] | (high[..., 1, :] << 2) | (high[..., 2, :] << 4) | (high[..., 3, :] << 6)
    out = np.concatenate([ql.reshape(*lead, 128), qh.reshape(*lead, 64), sc.view(np.uint8),
                          d.view(np.uint8).reshape(*lead, 2)], axis=-1)
    return out.reshape(x.shape[0], -1)

"""Weights kept in GGUF's own blocks (`--quantization gguf`): the grouped layout and its dequantization.

GGUF's Q8_0 / Q4_0 / Q4_1 blocks each hold 32 consecutive weights of one row of an HF [out, in] matrix (so a
group runs along the input dim) with a float16 scale d (Q4_1: and a float16 min m). We keep exactly those
numbers, re-laid out for x @ W with the group axis next to the dim it splits:

- a linear weight `X` [*stack, in, out]: values `X` (Q8_0: int8 [*stack, in, out]; Q4_0 / Q4_1: uint8
  [*stack, in // 2, out], two 4-bit values a byte), `X_scale` [*stack, in // 32, out] float16 (d) and, for Q4_1,
  `X_min` [*stack, in // 32, out] float16 (m).
- the embedding (also the tied LM head) [vocab, hidden]: the same with the group axis last, `embed_tokens`
  int8 [V, H] or uint8 [V, H // 2], `embed_tokens_scale` / `_min` [V, H // 32].

Packing (4-bit): along the group axis, byte j (0 <= j < 16) of group g holds element 32g + j in its low nibble
and element 32g + 16 + j in its high nibble: GGUF's order inside a block, so repacking moves bytes and never
splits them. Dequantized: Q8_0 d * q, Q4_0 d * (q - 8), Q4_1 d * q + m, all in float32 as gguf-py computes them
(d * q is exact in float32, so a fused multiply-add gives the same bits): the arrays the dequantizing loader
gives, bit for bit.

K-quants keep their sub-blocks as groups, with float32 scales (a super-block's float16 d times a sub-block's
integer scale is exact in float32, not in float16):

- Q4_K (256-weight super-blocks of eight 32-weight sub-blocks, 6-bit scales sc and mins m, float16 d and dmin):
  values packed like Q4_0 (repacked: Q4_K pairs sub-blocks 2j and 2j + 1 in one byte), `_scale` = d * sc and
  `_min` = -(dmin * m) per 32 rows; w = scale * q + min, gguf-py's d * sc * q - dmin * m to the bit. 6 bits a
  weight against the file's 4.5.
- Q6_K (sixteen 16-weight sub-blocks, int8 scales, float16 d, 6-bit q with offset 32): values int8 (q - 32),
  `_scale` = d * sc per 16 rows; w = scale * q. 10 bits a weight against the file's 6.56.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

GROUP = 32  # weights per Q8_0 / Q4_0 / Q4_1 block (and per Q4_K sub-block)
MIN_SUFFIX = "_min"
# the GGUF types kept quantized (lower-case GGML type names) -> rows per group along the grouped dim
GROUP_ROWS = {"q8_0": GROUP, "q4_0": GROUP, "q4_1": GROUP, "q4_k": GROUP, "q6_k": 16}
FORMATS = tuple(GROUP_ROWS)
_FLOAT32_SCALES = ("q4_k", "q6_k")  # K-quants: super-block d times sub-block scale, exact only in float32


def packed(fmt: str) -> bool:
    """Whether `fmt` stores two 4-bit values a byte."""
    return fmt in ("q4_0", "q4_1", "q4_k")


def has_min(fmt: str) -> bool:
    return fmt in ("q4_1", "q4_k")


def scale_dtype(fmt: str) -> np.dtype:
    return np.dtype(np.float32) if fmt in _FLOAT32_SCALES else np.dtype(np.float16)


def min_name(name: str) -> str:
    return name + MIN_SUFFIX


def grouped_shapes(shape: tuple[int, ...], fmt: str, axis: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{"values" / "scale" / "min": (shape, dtype)} of a weight of float `shape` kept as `fmt`, its groups along
    `axis` (-2 for a linear weight [.., in, out], -1 for the embedding [V, H]). The grouped dim must be a
    multiple of the format's group rows (GGUF's blocks make it one)."""
    axis = axis % len(shape)
    rows = GROUP_ROWS[fmt]
    if shape[axis] % rows:
        raise ValueError(f"a {fmt} weight of shape {shape} needs dim {axis} to be a multiple of {rows}")

    def along(n: int) -> tuple[int, ...]:
        return shape[:axis] + (n,) + shape[axis + 1:]

    out = {"values": (along(shape[axis] // 2) if packed(fmt) else shape,
                      np.dtype(np.uint8) if packed(fmt) else np.dtype(np.int8)),
           "scale": (along(shape[axis] // rows), scale_dtype(fmt))}
    if has_min(fmt):
        out["min"] = (along(shape[axis] // rows), scale_dtype(fmt))
    return out


def dequantize_grouped(values, scale, minimum, fmt: str, axis: int):
    """The float32 weight kept as (values, scale[, minimum]) in `fmt`, groups along `axis` of the full weight.
    numpy arrays give numpy, jax arrays jax (inside a program XLA fuses this into the consumer's operand)."""
    xp = np if isinstance(values, np.ndarray) else jnp
    ndim = values.ndim
    axis = axis % ndim
    lead, trail = values.shape[:axis], values.shape[axis + 1:]
    groups, rows = scale.shape[axis], GROUP_ROWS[fmt]
    if packed(fmt):
        nibbles = values.reshape(lead + (groups, rows // 2) + trail)
        q = xp.concatenate([nibbles & 15, nibbles >> 4], axis=axis + 1)
    else:
        q = values.reshape(lead + (groups, rows) + trail)
    q = q.astype(np.float32)
    if fmt == "q4_0":
        q = q - 8.0
    d = xp.expand_dims(scale.astype(np.float32), axis + 1)
    w = q * d
    if has_min(fmt):
        w = w + xp.expand_dims(minimum.astype(np.float32), axis + 1)
    return w.reshape(lead + (groups * rows,) + trail)

"""Quantized linear weights: `--quantization int8 | fp8` (docs/architecture/06-model.md, "Quantized weights").

A quantized weight is two sibling params: the values, `layers/q_proj` [L, in, out] in int8 or float8_e4m3fn, and
`layers/q_proj_scale` [L, out] float32, one symmetric scale per output channel (absmax of the channel over the
input dim / the format's largest value: 127 for int8, 448 for e4m3). w ~= values * scale[None, :].

How the matmul runs is fixed when the model is built (`Quantization`, static like the attention kernels):
- int8 on CPU: W8A8. Each row of the activation is quantized to int8 on the fly (its absmax / 127), the dot
  accumulates int8 x int8 in int32, and the result is scaled by (row scale x channel scale). XLA:CPU materializes
  a converted weight before a float dot, so weight-only int8 is slower there than float32; the int8 dot is
  2-5x faster than float32 at 2..512 rows (measured, docs/decisions.md, "Departures from the first design").
- int8 on TPU / GPU, fp8 everywhere: weight-only. The weight is converted to the activation dtype inside the
  dot (XLA fuses the convert into the dot on TPU / GPU) and the output is scaled per channel. On CPU fp8 is
  correct but not fast.

`--quantization gguf` keeps a GGUF file's own Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K blocks instead (model/grouped_quant.py:
values plus scales per group of 32 or 16 input rows): `Quantization.formats` names the params kept and their format,
read from the file; those weights are dequantized inside the dot on every platform
(docs/architecture/06-model.md, "Quantized weights").

Online quantization of a float checkpoint (`OnlineQuantization`, not a pre-quantized checkpoint's scheme) also
quantizes the embedding [V, H], one scale per vocab row (`embed_tokens_scale` [V, 1]: `quantize_table`), and an
untied LM head [H, V] per output channel like a linear; the tied head is weight-only
(quantized_dots.quantized_dot_rows).

The quantization itself (`quantize`) runs on numpy (the loader, per host slice) or jax (random init) arrays.

Grouped scales (a pre-quantized checkpoint's [128 out x 128 in] fp8 blocks, model_loader/prequantized.py): with a
group size g, a dense layer's scale is `layers/q_proj_scale` [L, in // g, out], one scale per output channel and
run of g input rows (a block scale repeated over its 128 output channels: exact), and
w ~= values * scale[k // g, :] for input row k. The scale's rank tells the two apart (values' rank: grouped, one
less: per channel). MoE experts keep per-channel scales.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import jax.numpy as jnp
import ml_dtypes
import numpy as np

SCALE_SUFFIX = "_scale"


@dataclass(frozen=True)
class QuantScheme:
    name: str
    dtype: np.dtype  # storage dtype of the values
    qmax: float  # largest magnitude the values hold: scale = channel absmax / qmax


SCHEMES: dict[str, QuantScheme] = {
    "int8": QuantScheme("int8", np.dtype(np.int8), 127.0),
    "fp8": QuantScheme("fp8", np.dtype(ml_dtypes.float8_e4m3fn), 448.0),
}

# The linear weights a dense or MoE layer quantizes (their [.., in, out] values get a [.., out] scale). The router,
# norms and biases stay in the model dtype; so do the embedding and LM head except under online quantization
# (`OnlineQuantization`).
QUANTIZED_LINEARS = frozenset(("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                               "experts_gate", "experts_up", "experts_down"))


GGUF = "gguf"  # --quantization gguf: keep the file's quantized blocks (model/grouped_quant.py)


@dataclass(frozen=True)
class KeptFormats:
    """What `--quantization gguf` keeps of one file: (param name, format) for each kept weight, e.g.
    ("q_proj", "q4_1"), ("embed_tokens", "q8_0"). Read from the file before the model is built
    (model_loader/gguf_file/kept.py); every other param stays in the model dtype."""

    formats: tuple[tuple[str, str], ...]


EMBEDDING = "embed_tokens"


@dataclass(frozen=True)
class OnlineQuantization:
    """`--quantization int8 | fp8` of a float checkpoint (quantized as it loads), as opposed to a pre-quantized
    checkpoint's scheme (a plain string): the embedding is quantized too, one scale per vocab row
    (`embed_tokens_scale` [V, 1]), and an untied LM head per output channel like the layers' linears
    (`lm_head_scale` [V]). A pre-quantized checkpoint's embedding and head stay float."""

    scheme: str


def scheme_name(scheme: str | OnlineQuantization | None) -> str | None:
    """The scheme's name (int8 / fp8 / ...) of a model's `quantization` argument, online or not."""
    return scheme.scheme if isinstance(scheme, OnlineQuantization) else scheme


@dataclass(frozen=True)
class Quantization:
    """A model's quantization, static (part of the graphdef): the scheme, whether activations are quantized
    too (W8A8: int8 on CPU), the input group size of grouped scales (None: one scale per output channel),
    for gguf the kept params' formats, and whether the embedding / LM head are quantized too (online int8 / fp8:
    `OnlineQuantization`)."""

    scheme: str
    quantize_activations: bool
    group_size: int | None = None
    formats: tuple[tuple[str, str], ...] = ()
    embedding: bool = False

    @classmethod
    def for_platform(cls, scheme: str | KeptFormats | OnlineQuantization | None, platform: str,
                     group_size: int | None = None) -> Quantization | None:
        if scheme is None:
            return None
        if isinstance(scheme, OnlineQuantization):
            if group_size is not None:
                raise ValueError("online quantization has one scale per output channel; got a group size")
            return dataclasses.replace(cls.for_platform(scheme.scheme, platform), embedding=True)
        if isinstance(scheme, KeptFormats):
            return cls(GGUF, quantize_activations=False, formats=scheme.formats)
        if scheme == GGUF:
            raise ValueError("quantization 'gguf' needs the file's formats (KeptFormats), read from a GGUF file")
        if scheme not in SCHEMES:
            raise ValueError(f"quantization must be one of {', '.join(SCHEMES)}; got {scheme!r}")
        if group_size is not None and scheme != "fp8":
            raise ValueError(f"grouped scales are read for fp8 only; got {scheme!r} with group size {group_size}")
        return cls(scheme, quantize_activations=scheme == "int8" and platform == "cpu" and group_size is None,
                   group_size=group_size)

    def scale_groups(self, name: str, in_dim: int) -> int | None:
        """How many input groups `name`'s scale has (None: per output channel; experts always are)."""
        if self.group_size is None or name.startswith("experts_"):
            return None
        return in_dim // group_rows(in_dim, self.group_size)

    def format_of(self, name: str) -> str | None:
        """gguf: the format `name` is kept in, or None (a float param)."""
        return dict(self.formats).get(name)

    @property
    def gguf_kept(self) -> bool:
        """GGUF blocks kept (model/grouped_quant.py), as opposed to per-channel or block-fp8 grouped scales."""
        return self.scheme == GGUF

    @property
    def dtype(self) -> np.dtype:
        return SCHEMES[self.scheme].dtype


def group_rows(in_dim: int, group_size: int) -> int:
    """The input rows one grouped scale covers: the group size, or where it does not divide the input dim (a
    checkpoint's last block is partial) the largest divisor of both, so no group straddles two blocks."""
    return group_size if in_dim % group_size == 0 else math.gcd(in_dim, group_size)


def scale_name(name: str) -> str:
    return name + SCALE_SUFFIX


def quantize(w, scheme: str):
    """(values, float32 scales) of a weight [..., in, out], one symmetric scale per output channel (reduced over
    axis -2). A numpy weight gives numpy arrays, a jax one jax arrays. An all-zero channel gets scale 1 (values 0)."""
    xp = np if isinstance(w, np.ndarray) else jnp
    s = SCHEMES[scheme]
    w = w.astype(np.float32)
    amax = xp.max(xp.abs(w), axis=-2)
    scale = xp.where(amax > 0, amax / s.qmax, 1.0).astype(np.float32)
    scaled = xp.clip(w / scale[..., None, :], -s.qmax, s.qmax)
    if s.dtype == np.int8:
        scaled = xp.round(scaled)
    return scaled.astype(s.dtype), scale


def quantize_table(table, scheme: str):
    """(values [.., V, H], float32 scales [.., V, 1]) of a table [.., V, H] (the embedding), one symmetric scale per
    row (reduced over H, the last axis): `quantize` of its transpose. w ~= values * scale."""
    xp = np if isinstance(table, np.ndarray) else jnp
    values, scale = quantize(xp.swapaxes(table, -1, -2), scheme)
    return xp.swapaxes(values, -1, -2), scale[..., None]


def dequantize(values, scale):
    """float32 values * scale: the weight a quantized pair stands for (per-channel or grouped scales)."""
    if scale.ndim == values.ndim:  # grouped: [.., in // g, out]
        rows = values.shape[-2] // scale.shape[-2]
        return values.astype(np.float32) * np.repeat(np.asarray(scale), rows, axis=-2)
    return values.astype(np.float32) * scale[..., None, :]


def quantize_rows(x):
    """Per-row symmetric int8 quantization of an activation [T, in]: (int8 values, float32 row scales [T, 1])."""
    xf = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(xf), axis=-1, keepdims=True)
    scale = jnp.where(amax > 0, amax / 127.0, 1.0)
    return jnp.clip(jnp.round(xf / scale), -127, 127).astype(jnp.int8), scale

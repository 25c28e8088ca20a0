"""The transformers config an HF checkpoint of a GGUF's model would carry, rebuilt from the file's metadata."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.gguf_file.reader import architecture, open_gguf, reports_source_errors
from vllm_jax.models.gguf_family import GgufArch, field, float32_decimal

_REQUIRED_KEYS = {  # "{arch}.<key>" -> HF config field
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
}
_DEFAULT_ROPE_THETA = 10000.0  # llama.cpp's when `{arch}.rope.freq_base` is absent (Gemma 2's converter omits it)


@reports_source_errors
def read_gguf_config(path: str) -> Any:
    """The HF config class of the file's architecture (its family's GgufArch) with `architectures` set, as HF
    would have it."""
    import transformers

    reader = open_gguf(path)
    entry = architecture(reader)
    arch = entry.name
    class_name, hf_arch = (entry.config_class_of(reader) if entry.config_class_of
                           else (entry.config_class, entry.hf_architecture))
    kwargs = _shape_fields(reader, arch, path)
    kwargs["rope_parameters"] = _rope_parameters(reader, entry, kwargs.pop("rope_theta"), kwargs["head_dim"])
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id")):
        kwargs[f"{name}_token_id"] = field(reader, f"tokenizer.ggml.{key}")
    kwargs.update(_layer_switches(reader, arch))
    if entry.config is not None:
        kwargs.update(entry.config(reader, kwargs))
    config_class = getattr(transformers, class_name)
    try:
        return config_class(architectures=[hf_arch], **kwargs)
    except Exception as exc:
        raise ModelSourceError(f"{path}: GGUF metadata gives an invalid {class_name} ({exc})") from exc


def _shape_fields(reader: Any, arch: str, path: str) -> dict[str, Any]:
    """Sizes, heads, norms, rope base and vocabulary: the required keys, then what llama.cpp lets default."""
    kwargs: dict[str, Any] = {}
    for key, hf_field in _REQUIRED_KEYS.items():
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ModelSourceError(f"{path}: GGUF metadata lacks {arch}.{key}, needed for {hf_field}")
        kwargs[hf_field] = float32_decimal(value) if isinstance(value, float) else value
    kwargs["rope_theta"] = float32_decimal(field(reader, f"{arch}.rope.freq_base", _DEFAULT_ROPE_THETA))
    heads, hidden = kwargs["num_attention_heads"], kwargs["hidden_size"]
    kwargs["num_key_value_heads"] = field(reader, f"{arch}.attention.head_count_kv", heads)
    kwargs["head_dim"] = (field(reader, f"{arch}.attention.key_length")
                          or field(reader, f"{arch}.rope.dimension_count") or hidden // heads)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = field(reader, f"{arch}.vocab_size") or (len(tokens.data) if tokens is not None else None)
    if vocab is None:
        vocab = next((int(t.shape[1]) for t in reader.tensors if t.name == "token_embd.weight"), None)
    kwargs["vocab_size"] = vocab
    return kwargs


def _layer_switches(reader: Any, arch: str) -> dict[str, Any]:
    """Tied embeddings, sliding window and attention biases, which GGUF states by the tensors present or one key
    (a family's config hook adds or drops its own)."""
    tensor_names = {t.name for t in reader.tensors}
    switches: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in tensor_names}
    switches["sliding_window"] = field(reader, f"{arch}.attention.sliding_window")  # None matters for Mistral,
    # whose config class defaults to 4096
    switches["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    return switches


def _rope_parameters(reader: Any, entry: GgufArch, theta: float, head_dim: int) -> dict[str, Any]:
    """transformers 5 keeps rope_theta and scaling together in `rope_parameters`."""
    arch = entry.name
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    legacy_linear = field(reader, f"{arch}.rope.scale_linear")  # old files state only this
    kind = field(reader, f"{arch}.rope.scaling.type", "linear" if legacy_linear else "none")
    factor = field(reader, f"{arch}.rope.scaling.factor") or legacy_linear
    original = field(reader, f"{arch}.rope.scaling.original_context_length")
    if kind == "linear" and factor not in (None, 1.0):
        params.update(rope_type="linear", factor=float32_decimal(factor))
    elif kind == "yarn":
        params.update(rope_type="yarn", factor=float32_decimal(factor or 1.0))
        if original:
            params["original_max_position_embeddings"] = int(original)
        for key in ("beta_fast", "beta_slow"):
            if (value := field(reader, f"{arch}.rope.scaling.yarn_{key}")) is not None:
                params[key] = float32_decimal(value)
    elif kind not in ("none", "linear"):
        raise ModelSourceError(f"{reader.data.filename}: rope scaling type {kind!r} is not supported "
                               "(supported: none, linear, yarn)")
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None and entry.llama3_rope_freqs:  # else the family's own (Gemma 4's proportional-rope mask)
        import gguf

        divisors = np.asarray(gguf.quants.dequantize(freqs.data, freqs.tensor_type), np.float64).reshape(-1)
        params.update(_llama3_rope(divisors, theta, head_dim, reader.data.filename))
    return params


def _llama3_rope(divisors: np.ndarray, theta: float, head_dim: int, path: str) -> dict[str, Any]:
    """Llama 3.x files keep rope scaling only as per-frequency divisors (`rope_freqs.weight`) that llama.cpp
    computed from HF's llama3 parameters; fit those parameters back.

    In the blend band 1/divisor is linear in the frequency, which fixes two combinations of (original length,
    low_freq_factor, high_freq_factor); nothing else depends on them, so the original length can be set to
    Llama 3's 8192 without changing a single frequency. The fit is checked by recomputing the divisors.
    """
    if np.allclose(divisors, 1.0):
        return {}
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factor = float(divisors.max())
    band = (divisors > 1 + 1e-4) & (divisors < factor * (1 - 1e-4))
    if divisors.shape != freqs.shape or band.sum() < 2:
        raise ModelSourceError(f"{path}: rope_freqs.weight cannot be expressed as llama3 rope scaling")
    smooth = (1 / divisors[band] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(freqs[band], smooth, 1)  # smooth = (L * f / 2pi - low) / (high - low)
    original = 8192
    spread = original / (2 * math.pi * slope)
    low = -intercept * spread
    params = {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(low),
              "high_freq_factor": float(low + spread), "original_max_position_embeddings": original}
    blend = np.clip((original * freqs / (2 * math.pi) - low) / spread, 0.0, 1.0)
    if not np.allclose(1 / ((1 - blend) / factor + blend), divisors, rtol=1e-3):
        raise ModelSourceError(f"{path}: rope_freqs.weight does not follow llama3 rope scaling")
    return params

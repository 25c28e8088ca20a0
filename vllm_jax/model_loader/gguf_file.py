"""Reading a GGUF file (llama.cpp's format) as a transformers config, a tokenizer and HF-named float32 weights.

A GGUF carries no config.json, no tokenizer.json and no safetensors: its metadata is the config and the
tokenizer, and its tensors use llama.cpp names, ggml shapes and (often) quantized blocks. Everything here
turns that back into what an HF checkpoint of the same model would give, so the rest of the engine never
knows the model came from a GGUF:

    config = read_gguf_config(path)          # LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config
    tokenizer = load_gguf_tokenizer(path)    # PreTrainedTokenizerFast with the file's chat template
    for name, array in iter_gguf_tensors(path):   # ("model.layers.0.self_attn.q_proj.weight", float32 [out, in])
        ...

Weights are dequantized to float32 at load (F32, F16, BF16, Q8_0, Q4_0, Q4_1); casting to the model dtype is
the loader's job. llama.cpp permutes the q/k projection rows of llama-family models for its rotary layout;
that is undone here, so the arrays equal the HF weights. No torch anywhere: `gguf` reads with numpy.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import numpy as np

from vllm_jax.model_loader.source import ModelSourceError

_ARCHS = {  # general.architecture -> (config class name, HF architectures entry, q/k rows permuted by llama.cpp)
    "llama": ("LlamaConfig", "LlamaForCausalLM", True),
    "mistral": ("MistralConfig", "MistralForCausalLM", True),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", False),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", False),
}

_REQUIRED_KEYS = {  # "{arch}.<key>" -> HF config field
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
}

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output": "lm_head",
    "output_norm": "model.norm",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_NOT_PARAMETERS = {"rope_freqs.weight"}  # llama.cpp's precomputed rope factors; read_gguf_config folds them in
_SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


@lru_cache(maxsize=2)
def _open_reader(path: str, _mtime_ns: int, _size: int) -> Any:
    """Parsing the metadata costs seconds on a real vocabulary; config, tokenizer and weights share one parse."""
    import gguf

    try:
        return gguf.GGUFReader(path)
    except Exception as exc:  # bad magic, truncated header or data, unknown value type, ...
        raise ModelSourceError(f"{path}: not a GGUF file, or a truncated or corrupt one "
                               f"({type(exc).__name__}: {exc})") from exc


def _reader(path: str) -> Any:
    path = os.path.realpath(os.path.expanduser(str(path)))
    if not os.path.isfile(path):
        raise ModelSourceError(f"{path}: no such GGUF file")
    stat = os.stat(path)
    return _open_reader(path, stat.st_mtime_ns, stat.st_size)


def _get(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    try:
        return field.contents()
    except Exception as exc:
        raise ModelSourceError(f"{reader.data.filename}: metadata {key} is corrupt ({exc})") from exc


def _architecture(reader: Any) -> str:
    arch = _get(reader, "general.architecture")
    if arch not in _ARCHS:
        raise ModelSourceError(f"{reader.data.filename}: GGUF architecture {arch!r} is not supported "
                               f"(supported: {', '.join(_ARCHS)})")
    return arch


def read_gguf_config(path: str) -> Any:
    """The transformers config an HF checkpoint of this model would carry, rebuilt from the GGUF metadata."""
    import transformers

    reader = _reader(path)
    arch = _architecture(reader)
    class_name, hf_arch, _ = _ARCHS[arch]
    kwargs: dict[str, Any] = {}
    for key, field in _REQUIRED_KEYS.items():
        value = _get(reader, f"{arch}.{key}")
        if value is None:
            raise ModelSourceError(f"{path}: GGUF metadata lacks {arch}.{key}, needed for {field}")
        kwargs[field] = _decimal(value) if isinstance(value, float) else value
    heads, hidden = kwargs["num_attention_heads"], kwargs["hidden_size"]
    kwargs["num_key_value_heads"] = _get(reader, f"{arch}.attention.head_count_kv", heads)
    kwargs["head_dim"] = (_get(reader, f"{arch}.attention.key_length")
                          or _get(reader, f"{arch}.rope.dimension_count") or hidden // heads)
    tensor_names = {t.name for t in reader.tensors}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = _get(reader, f"{arch}.vocab_size") or (len(tokens.data) if tokens is not None else None)
    if vocab is None and "token_embd.weight" in tensor_names:
        vocab = int(next(t.shape[1] for t in reader.tensors if t.name == "token_embd.weight"))
    kwargs["vocab_size"] = vocab
    kwargs["tie_word_embeddings"] = "output.weight" not in tensor_names
    kwargs["rope_parameters"] = _rope_parameters(reader, arch, kwargs.pop("rope_theta"), kwargs["head_dim"])
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id")):
        kwargs[f"{name}_token_id"] = _get(reader, f"tokenizer.ggml.{key}")
    window = _get(reader, f"{arch}.attention.sliding_window")
    kwargs["sliding_window"] = window  # None matters for Mistral, whose config class defaults to 4096
    if window is not None and arch in ("qwen2", "qwen3"):
        kwargs.update(use_sliding_window=True, max_window_layers=0)  # one window for every layer, as llama.cpp
    if arch != "qwen2":  # Qwen2 always has q/k/v biases; the others say so in the config
        kwargs["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    if arch == "llama":
        kwargs["mlp_bias"] = "blk.0.ffn_up.bias" in tensor_names
    config_class = getattr(transformers, class_name)
    try:
        return config_class(architectures=[hf_arch], **kwargs)
    except Exception as exc:
        raise ModelSourceError(f"{path}: GGUF metadata gives an invalid {class_name} ({exc})") from exc


def _decimal(value: float) -> float:
    """GGUF stores float32: 1e-5 comes back as 9.99999974e-06 unless read as the shortest float32 decimal."""
    return float(str(np.float32(value)))


def _rope_parameters(reader: Any, arch: str, theta: float, head_dim: int) -> dict[str, Any]:
    """transformers 5 keeps rope_theta and scaling together in `rope_parameters`."""
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    legacy_linear = _get(reader, f"{arch}.rope.scale_linear")  # old files state only this
    kind = _get(reader, f"{arch}.rope.scaling.type", "linear" if legacy_linear else "none")
    factor = _get(reader, f"{arch}.rope.scaling.factor") or legacy_linear
    original = _get(reader, f"{arch}.rope.scaling.original_context_length")
    if kind == "linear" and factor not in (None, 1.0):
        params.update(rope_type="linear", factor=_decimal(factor))
    elif kind == "yarn":
        params.update(rope_type="yarn", factor=_decimal(factor or 1.0))
        if original:
            params["original_max_position_embeddings"] = int(original)
        for key in ("beta_fast", "beta_slow"):
            if (value := _get(reader, f"{arch}.rope.scaling.yarn_{key}")) is not None:
                params[key] = _decimal(value)
    elif kind not in ("none", "linear"):
        raise ModelSourceError(f"{reader.data.filename}: rope scaling type {kind!r} is not supported "
                               "(supported: none, linear, yarn)")
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
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


def load_gguf_tokenizer(path: str) -> Any:
    """The file's tokenizer as a PreTrainedTokenizerFast: vocabulary, merges, special tokens and chat template."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (GGUF_TOKENIZER_MAPPING,
                                                                       convert_gguf_tokenizer)

    reader = _reader(path)
    tokens = _get(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise ModelSourceError(f"{path}: this GGUF file carries no tokenizer (tokenizer.ggml.tokens missing)")
    tokenizer_dict = {name: _get(reader, f"tokenizer.{key}")
                      for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
                      if f"tokenizer.{key}" in reader.fields}
    try:
        backend, _ = convert_gguf_tokenizer(_get(reader, "general.architecture"), tokenizer_dict)
    except Exception as exc:
        raise ModelSourceError(f"{path}: cannot build the tokenizer ({exc})") from exc
    kwargs: dict[str, Any] = {}
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                      ("pad", "padding_token_id")):
        token_id = _get(reader, f"tokenizer.ggml.{key}")
        if token_id is not None and 0 <= token_id < len(tokens):
            kwargs[f"{name}_token"] = tokens[token_id]
    # llama.cpp adds BOS to a sentencepiece vocabulary that does not say otherwise
    default_bos = tokenizer_dict.get("tokenizer_type") == "llama"
    kwargs["add_bos_token"] = bool(_get(reader, "tokenizer.ggml.add_bos_token", default_bos))
    kwargs["add_eos_token"] = bool(_get(reader, "tokenizer.ggml.add_eos_token", False))
    if (template := _get(reader, "tokenizer.chat_template")) is not None:
        kwargs["chat_template"] = template
    if (arch := _get(reader, "general.architecture")) and (ctx := _get(reader, f"{arch}.context_length")):
        kwargs["model_max_length"] = int(ctx)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


def _hf_name(gguf_name: str) -> str | None:
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES and kind in ("weight", "bias"):
        return f"{_GLOBAL_NAMES[stem]}.{kind}"
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match and match.group(2) in _BLOCK_NAMES:
        return f"model.layers.{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}.{match.group(3)}"
    return None


def _unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `LlamaModel.permute`: per head, its rows went from (2, d/2) to (d/2, 2) order."""
    shape = rows.shape
    return rows.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def iter_gguf_tensors(path: str) -> Iterator[tuple[str, np.ndarray]]:
    """(HF parameter name, float32 array in HF layout) for every tensor, dequantized one at a time."""
    import gguf

    reader = _reader(path)
    arch = _architecture(reader)
    permuted = _ARCHS[arch][2]
    heads = _get(reader, f"{arch}.attention.head_count")
    kv_heads = _get(reader, f"{arch}.attention.head_count_kv", heads)
    supported = {getattr(gguf.GGMLQuantizationType, t) for t in _SUPPORTED_TYPES}
    for tensor in reader.tensors:
        if tensor.name in _NOT_PARAMETERS:
            continue
        name = _hf_name(tensor.name)
        if name is None:
            raise ModelSourceError(f"{path}: tensor {tensor.name} has no HF counterpart for architecture {arch}")
        qtype = tensor.tensor_type
        if qtype not in supported:
            raise ModelSourceError(f"{path}: tensor {tensor.name} is stored as {qtype.name}, which this engine "
                                   f"cannot dequantize (supported: {', '.join(_SUPPORTED_TYPES)})")
        shape = tuple(int(n) for n in reversed(tensor.shape))  # ggml lists dimensions fastest first
        try:
            array = np.asarray(gguf.quants.dequantize(tensor.data, qtype), dtype=np.float32).reshape(shape)
            if not array.flags.writeable:  # F32 comes back as a view of the read-only file mapping
                array = array.copy()
        except Exception as exc:
            raise ModelSourceError(f"{path}: tensor {tensor.name} ({qtype.name}, shape {shape}) is corrupt "
                                   f"({exc})") from exc
        if permuted and tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
            array = _unpermute(array, heads)
        elif permuted and tensor.name.endswith(("attn_k.weight", "attn_k.bias")):
            array = _unpermute(array, kv_heads)
        yield name, array

"""Finding the model and reading what it is: config's one door to the loader (model_loader.source and
model_loader.prequantized, imported when a config is created, never when this package is imported).

The loader, the model and the layers below them never import config, so the import graph runs one way:
entry points -> engine / worker -> config -> model_loader -> model."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from vllm_jax.config.engine_config import ModelConfig
from vllm_jax.config.flag_checks import KV_CACHE_DTYPE_NAMES
from vllm_jax.spec_decode.config import SpeculativeConfig

if TYPE_CHECKING:
    from vllm_jax.model_loader.prequantized import PrequantizedConfig
    from vllm_jax.model_loader.source import ModelSource

logger = logging.getLogger(__name__)
# KV cache dtypes whose every-step write XLA:CPU widens to float32 over the whole cache (docs/quantization.md,
# "fp8 KV cache"): warned about on CPU, where float16 halves the cache without that cost.
SLOW_CPU_KV_DTYPES = ("bfloat16", "float8_e4m3fn")


@dataclasses.dataclass(frozen=True)
class ModelFlags:
    """The flags that say which model to run and how (EngineArgs' fields of the same names)."""

    model: str | None
    tokenizer: str | None
    served_model_name: str | None
    dtype: str
    quantization: str | None
    kv_cache_dtype: str
    max_model_len: int | None
    seed: int
    max_logprobs: int


def resolve_model_config(flags: ModelFlags, platform: str) -> ModelConfig:
    """Find the model, read its HF config, resolve the dtypes and the context length."""
    from vllm_jax.model_loader.source import load_hf_config, resolve_model_source

    source = resolve_model_source(flags.model)
    hf_config = load_hf_config(source)
    dtype = flags.dtype if flags.dtype != "auto" else ("float32" if platform == "cpu" else "bfloat16")
    max_pos = getattr(hf_config, "max_position_embeddings", None) or 2048
    max_model_len = flags.max_model_len or max_pos
    if max_model_len > max_pos:
        raise ValueError(
            f"max_model_len ({max_model_len}) is larger than the model's max_position_embeddings ({max_pos})")
    quantization, group_size, prequantized = _quantization(flags.quantization, source)
    kv_cache_dtype = (dtype if flags.kv_cache_dtype == "auto"
                      else KV_CACHE_DTYPE_NAMES.get(flags.kv_cache_dtype, flags.kv_cache_dtype))
    if platform == "cpu" and kv_cache_dtype in SLOW_CPU_KV_DTYPES:
        logger.warning("a %s KV cache on CPU: XLA:CPU converts the whole cache to float32 and back to write "
                       "each step's keys (a 32-sequence decode step measured ~11x slower than with a float32 "
                       "cache); --kv-cache-dtype float16 halves the cache without that cost", kv_cache_dtype)
    return ModelConfig(
        model=flags.model or source.path, source=source, hf_config=hf_config, dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        max_model_len=max_model_len,
        served_model_name=flags.served_model_name or (flags.model or source.default_name),
        tokenizer=flags.tokenizer, seed=flags.seed, max_logprobs=flags.max_logprobs, quantization=quantization,
        quantization_group_size=group_size,
        quantization_online=quantization in ("int8", "fp8") and prequantized is None)


def _quantization(requested: str | None,
                  source: ModelSource) -> tuple[str | None, int | None, PrequantizedConfig | None]:
    """The weights' scheme, its group size and the pre-quantized checkpoint's config (None: a float one): a
    pre-quantized checkpoint's scheme comes from its config.json, as in vLLM."""
    if requested == "gguf" and source.kind != "gguf":
        raise ValueError(f"quantization 'gguf' keeps a GGUF file's quantized blocks; {source.path} is not a GGUF "
                         "file (for a float checkpoint use --quantization int8 or fp8)")
    if requested is not None and source.kind == "orbax":
        raise ValueError(f"quantization {requested!r} quantizes a float checkpoint as it loads; "
                         f"{source.path} is a `vllm-jax convert` directory, which it does not read yet: pass "
                         "the original safetensors or GGUF model")
    if source.kind == "hf":
        from vllm_jax.model_loader.prequantized import read_prequantized_config, resolve_quantization

        prequantized = read_prequantized_config(source.path)
        group_size = prequantized.group_size if prequantized is not None else None
        return resolve_quantization(requested, prequantized, source.path), group_size, prequantized
    if requested == "compressed-tensors":
        raise ValueError(f"quantization 'compressed-tensors' reads a pre-quantized HF checkpoint; {source.path} "
                         f"is a {source.kind} model")
    return requested, None, None


def draft_model_config(speculative: SpeculativeConfig | None, target: ModelConfig) -> ModelConfig | None:
    """The draft model's config for method draft_model. Its proposals are token ids the target verifies, so
    its vocabulary must be the target's; it runs at the target's dtypes over the same context."""
    if speculative is None or speculative.method != "draft_model":
        return None
    from vllm_jax.model_loader.source import load_hf_config, resolve_model_source

    source = resolve_model_source(speculative.model)
    hf_config = load_hf_config(source)
    vocab, target_vocab = getattr(hf_config, "vocab_size", None), getattr(target.hf_config, "vocab_size", None)
    if vocab != target_vocab:
        raise ValueError(f"speculative_config.model {speculative.model!r} has another vocabulary than the "
                         f"target (vocab_size {vocab} vs {target_vocab}): a draft model must share the "
                         "target's tokenizer")
    max_pos = getattr(hf_config, "max_position_embeddings", None) or target.max_model_len
    if max_pos < target.max_model_len:
        raise ValueError(f"speculative_config.model {speculative.model!r} covers {max_pos} positions "
                         f"(max_position_embeddings), fewer than max_model_len ({target.max_model_len})")
    return dataclasses.replace(target, model=speculative.model, source=source, hf_config=hf_config,
                               served_model_name=source.default_name, tokenizer=None,
                               quantization=None, quantization_group_size=None,
                               quantization_online=False)  # the draft stays float

"""Tokenizer and generation defaults for a model source (transformers' own tokenizers, never remote code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_jax.config import ModelConfig
from vllm_jax.model_loader.errors import ModelSourceError


def load_tokenizer(model_config: ModelConfig) -> Any:
    path = model_config.tokenizer or model_config.source.path
    if model_config.tokenizer is None and model_config.source.kind == "gguf":
        from vllm_jax.model_loader.gguf_file import load_gguf_tokenizer

        return load_gguf_tokenizer(path)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise ModelSourceError(f"{path}: cannot load a tokenizer ({exc})") from exc


def generation_eos_token_ids(model_config: ModelConfig) -> set[int]:
    """Extra EOS ids from generation_config.json (e.g. Llama 3's <|eot_id|>), which also end generation."""
    ids: set[int] = set()
    if model_config.source.kind in ("hf", "orbax"):
        gen = Path(model_config.source.path) / "generation_config.json"
        if gen.is_file():
            try:
                eos = json.loads(gen.read_text()).get("eos_token_id")
            except json.JSONDecodeError as exc:
                raise ModelSourceError(f"{gen}: invalid JSON ({exc})") from exc
            ids.update([eos] if isinstance(eos, int) else (eos or []))
    eos = getattr(model_config.hf_config, "eos_token_id", None)
    ids.update([eos] if isinstance(eos, int) else (eos or []))
    return ids

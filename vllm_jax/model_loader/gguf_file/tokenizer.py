"""A GGUF's tokenizer as a PreTrainedTokenizerFast: vocabulary, merges, special tokens and chat template."""

from __future__ import annotations

from typing import Any

from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.gguf_file.reader import open_gguf, reports_source_errors
from vllm_jax.models.gguf_family import field


@reports_source_errors
def load_gguf_tokenizer(path: str) -> Any:
    """The tokenizer llama.cpp would use for this file, built with transformers' own GGUF conversion."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    reader = open_gguf(path)
    tokens = field(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise ModelSourceError(f"{path}: this GGUF file carries no tokenizer (tokenizer.ggml.tokens missing)")
    tokenizer_dict = {name: field(reader, f"tokenizer.{key}")
                      for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
                      if f"tokenizer.{key}" in reader.fields}
    try:
        backend, _ = convert_gguf_tokenizer(field(reader, "general.architecture"), tokenizer_dict)
    except Exception as exc:
        raise ModelSourceError(f"{path}: cannot build the tokenizer ({exc})") from exc
    kwargs = _special_tokens(reader, tokens)
    # llama.cpp adds BOS to a sentencepiece vocabulary that does not say otherwise
    default_bos = tokenizer_dict.get("tokenizer_type") == "llama"
    kwargs["add_bos_token"] = bool(field(reader, "tokenizer.ggml.add_bos_token", default_bos))
    kwargs["add_eos_token"] = bool(field(reader, "tokenizer.ggml.add_eos_token", False))
    if (template := field(reader, "tokenizer.chat_template")) is not None:
        kwargs["chat_template"] = template
    if (arch := field(reader, "general.architecture")) and (ctx := field(reader, f"{arch}.context_length")):
        kwargs["model_max_length"] = int(ctx)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


def _special_tokens(reader: Any, tokens: list[str]) -> dict[str, str]:
    """bos/eos/unk/pad tokens by the ids the metadata gives (ids outside the vocabulary are ignored)."""
    special: dict[str, str] = {}
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                      ("pad", "padding_token_id")):
        token_id = field(reader, f"tokenizer.ggml.{key}")
        if token_id is not None and 0 <= token_id < len(tokens):
            special[f"{name}_token"] = tokens[token_id]
    return special

"""vLLM's /tokenizer_info body: the tokenizer's configuration, so that a client (lm-eval's remote tokenizer) can
read its special tokens and chat template without the model files.

As vLLM builds it: the tokenizer's `init_kwargs` without the file paths (`vocab_file`, `merges_file`), special
tokens as their text, plus `tokenizer_class` and the chat template. The template is the one chats are rendered
with (--chat-template, else the tokenizer's own; vLLM's reads only --chat-template). Values JSON cannot carry
(the tokenizer object a GGUF tokenizer is built from) are left out rather than failing the route.
"""

from __future__ import annotations

from typing import Any

_PATH_FIELDS = ("vocab_file", "merges_file")
_DROP = object()  # marks a value JSON cannot carry


def tokenizer_info(tokenizer: Any, chat_template: str | None) -> dict[str, Any]:
    config = {k: v for k, v in (getattr(tokenizer, "init_kwargs", None) or {}).items() if k not in _PATH_FIELDS}
    info = _json_value(config)
    info["tokenizer_class"] = type(tokenizer).__name__
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        info["chat_template"] = template
    return info


def _json_value(value: Any) -> Any:
    """`value` as JSON data: special tokens (AddedToken) become their text; what JSON cannot hold is dropped."""
    if hasattr(value, "content") and isinstance(value.content, str):
        return value.content
    if isinstance(value, dict):
        items = ((str(k), _json_value(v)) for k, v in value.items())
        return {k: v for k, v in items if v is not _DROP}
    if isinstance(value, (list, tuple)):
        return [v for v in map(_json_value, value) if v is not _DROP]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return _DROP

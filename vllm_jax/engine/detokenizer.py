"""Incremental detokenization: token ids in, newly decodable text out, one step at a time.

Streaming needs the text of each new token, but a token's text depends on its neighbours: byte-level BPE
splits one multi-byte character over several tokens, and SentencePiece-style (Metaspace) decoders drop the
leading space of the first token only. So every step decodes a short window of context tokens plus the
new ones and emits the difference to the window's own text; a step whose decode ends in U+FFFD (an
incomplete UTF-8 character, or invalid bytes) emits nothing until a valid character follows or the request
ends. The window is the tokens since the previous emission, so the cost of a step is O(new tokens), not
O(generated so far); only a run of invalid bytes grows the window (splitting such a run early can change how
many U+FFFD a full decode would give, so the exact text wins over the bounded cost there).

Two implementations of that idea sit behind `IncrementalDetokenizer`:

- `tokenizers.decoders.DecodeStream` (the tokenizers library's own stream decoder) for fast tokenizers;
- a prefix/read-offset decoder over `tokenizer.decode` for anything else (slow tokenizers), and as the
  recovery path when DecodeStream meets text that is not prefix-stable (it raises "Invalid prefix" on some
  invalid byte sequences).

Semantics (as in vLLM): the window starts in the prompt's last tokens, so the emitted text is
`decode(prompt + out)` minus `decode(prompt)`. For byte-level BPE that is `decode(out)`; for Metaspace
tokenizers the first output token keeps its leading space (" Paris", not "Paris"). With an empty prompt,
or one that decodes to "" (a lone BOS with skip_special_tokens), it is exactly `decode(out)`.
`clean_up_tokenization_spaces` is never applied: it rewrites text across token boundaries. For fast
tokenizers `spaces_between_special_tokens` has no effect, exactly as in their `decode`; slow tokenizers
receive it.

A request whose text nobody reads before it ends (FINAL_ONLY output, no stop strings) hands its tokens over once,
at the end (`finish`): where the tokenizer's decoder maps each token to its own text (byte-level BPE, Metaspace
and SentencePiece's replace / byte-fallback / fuse / strip chain, or none), that is one decode of the window
instead of a step per token (docs/performance.md, "Host overhead per step"); the text is the same as stepping
would give (stepping is still used when that decode shows U+FFFD, whose count depends on how the bytes were
split).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

try:  # the tokenizers library ships with transformers; keep the module importable without it
    from tokenizers import Tokenizer as _RustTokenizer
    from tokenizers.decoders import DecodeStream as _DecodeStream
except ImportError:  # pragma: no cover
    _RustTokenizer = None
    _DecodeStream = None

_REPLACEMENT = "\ufffd"
# Context taken from the prompt: at least this many tokens, more (up to the max) while the window would
# start inside a multi-byte character.
_MIN_PROMPT_CONTEXT = 5
_MAX_PROMPT_CONTEXT = 24
# Decoders that turn each token into its own text, independently of its neighbours (Strip removes characters at
# the start of the text, in the window and in its context alike): a window's decode minus its context's decode
# is then what stepping through it emits.
_PER_TOKEN_DECODERS = frozenset(("ByteLevel", "Metaspace", "Replace", "ByteFallback", "Fuse", "Strip"))


def _make_decode(tokenizer: Any, skip_special_tokens: bool,
                 spaces_between_special_tokens: bool) -> Callable[[list[int]], str]:
    """A list[int] -> str decoder with the request's options and no cleanup."""
    if _RustTokenizer is not None and isinstance(tokenizer, _RustTokenizer):
        return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    backend = _backend(tokenizer)
    if backend is not None:
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                        spaces_between_special_tokens=spaces_between_special_tokens,
                                        clean_up_tokenization_spaces=False)


def _backend(tokenizer: Any) -> Any | None:
    """The tokenizers.Tokenizer behind a transformers fast tokenizer, or None."""
    if _RustTokenizer is None:
        return None
    if isinstance(tokenizer, _RustTokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if isinstance(backend, _RustTokenizer) else None


def _prompt_context(decode: Callable[[list[int]], str], prompt_token_ids: list[int]) -> list[int]:
    """The prompt's last tokens, starting on a character boundary and ending on a complete character."""
    n = len(prompt_token_ids)
    k = min(n, _MIN_PROMPT_CONTEXT)
    limit = min(n, _MAX_PROMPT_CONTEXT)
    while k < limit and decode(list(prompt_token_ids[n - k:])).startswith(_REPLACEMENT):
        k += 1
    context = list(prompt_token_ids[n - k:])
    # A prompt that ends mid-character would make its own bytes part of the first output text.
    return [] if decode(context).endswith(_REPLACEMENT) else context


def _decodes_per_token(backend: Any) -> bool:
    """True when `backend` has no decoder or one of _PER_TOKEN_DECODERS (or a sequence of them); a Strip only
    at the start of the text."""
    decoder = backend.decoder
    if decoder is None:
        return True
    state = json.loads(decoder.__getstate__())
    parts = state.get("decoders", []) if state.get("type") == "Sequence" else [state]
    return all(part.get("type") in _PER_TOKEN_DECODERS and not part.get("stop") for part in parts)


class _OffsetDecoder:
    """Prefix/read-offset incremental decoding over any `decode(list[int]) -> str`."""

    def __init__(self, decode: Callable[[list[int]], str], context: list[int]):
        self._decode = decode
        self._ids = list(context)
        self._prefix = 0  # window start: text before it has been emitted long ago
        self._read = len(self._ids)  # text of ids[_prefix:_read] has been emitted
        self._prefix_text = decode(self._ids)

    def push(self, token_ids: list[int]) -> str:
        self._ids.extend(token_ids)
        text = self._decode(self._ids[self._prefix:])
        if len(text) <= len(self._prefix_text) or text.endswith(_REPLACEMENT):
            return ""
        return self._advance(text)

    def flush(self) -> str:
        """Emit whatever is pending, incomplete characters included (as U+FFFD)."""
        if len(self._ids) == self._read:
            return ""
        return self._advance(self._decode(self._ids[self._prefix:]))

    def _advance(self, text: str) -> str:
        new = text[len(self._prefix_text):] if text.startswith(self._prefix_text) else \
            self._decode(self._ids[self._read:])
        del self._ids[:self._read]  # keep only the tokens just emitted as the next window's context
        self._prefix, self._read = 0, len(self._ids)
        self._prefix_text = self._decode(self._ids)
        return new


class _StreamDecoder:
    """tokenizers' DecodeStream, plus what it lacks: a flush and recovery."""

    def __init__(self, backend: Any, skip_special_tokens: bool, decode: Callable[[list[int]], str],
                 context: list[int], per_token: bool):
        self._backend = backend
        self._per_token = per_token
        self._skip = skip_special_tokens
        self._decode = decode
        self._context: list[int] = []  # tokens of the last emitted chunk (what the stream's window holds)
        self._pending: list[int] = []  # pushed since the last emission
        self._fallback: _OffsetDecoder | None = None
        self._restart(context)

    def _restart(self, context: list[int]) -> None:
        try:
            self._stream = _DecodeStream(ids=list(context), skip_special_tokens=self._skip)
        except TypeError:  # tokenizers < 0.22: no prefill argument; prime by stepping
            self._stream = _DecodeStream(skip_special_tokens=self._skip)
            for token_id in context:
                self._stream.step(self._backend, token_id)
        self._context = list(context)
        self._pending = []

    def push(self, token_ids: list[int]) -> str:
        if self._fallback is not None:
            return self._fallback.push(token_ids)
        text = ""  # usually one token: plain concatenation beats a list and a join
        stream, backend = self._stream, self._backend
        for i, token_id in enumerate(token_ids):
            try:
                piece = stream.step(backend, token_id)
            except Exception as exc:  # "Invalid prefix": text that is not prefix-stable (invalid bytes)
                if "prefix" not in str(exc).lower():
                    raise
                self._fallback = _OffsetDecoder(self._decode, self._context)
                return text + self._fallback.push(self._pending + list(token_ids[i:]))
            self._pending.append(token_id)
            if piece is not None:
                self._context, self._pending = self._pending, []
                text += piece
        return text

    def one_decode(self, token_ids: list[int]) -> str | None:
        """What `push(token_ids)` then `flush()` would return, from one decode of the window; None where that
        decode could differ (a decoder that is not per token, U+FFFD in the text, the fallback in use)."""
        if not self._per_token or self._fallback is not None:
            return None
        text = self._decode(self._context + self._pending + token_ids)
        context_text = self._decode(self._context) if self._context else ""
        if _REPLACEMENT in text or not text.startswith(context_text):
            return None
        return text[len(context_text):]

    def flush(self) -> str:
        """Emit whatever is pending, incomplete characters included (as U+FFFD)."""
        if self._fallback is not None:
            return self._fallback.flush()
        if not self._pending:
            return ""
        window = self._context + self._pending
        context_text, text = self._decode(self._context), self._decode(window)
        new = text[len(context_text):] if text.startswith(context_text) else self._decode(self._pending)
        self._restart([] if text.endswith(_REPLACEMENT) else window)
        return new


class IncrementalDetokenizer:
    """Turns one request's output tokens into text incrementally; see the module docstring."""

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True):
        decode = _make_decode(tokenizer, skip_special_tokens, spaces_between_special_tokens)
        context = _prompt_context(decode, list(prompt_token_ids or []))
        backend = _backend(tokenizer)
        if backend is not None and _DecodeStream is not None:
            self._impl: _StreamDecoder | _OffsetDecoder = _StreamDecoder(
                backend, skip_special_tokens, decode, context, _decodes_per_token(backend))
        else:
            self._impl = _OffsetDecoder(decode, context)
        # `push` for a non-empty list, without its checks: the output processor's per-token call
        self.push_list: Callable[[list[int]], str] = self._impl.push

    @property
    def uses_decode_stream(self) -> bool:
        """True while tokenizers' DecodeStream does the work (False: prefix/read-offset fallback)."""
        return isinstance(self._impl, _StreamDecoder) and self._impl._fallback is None

    def push(self, token_ids: list[int]) -> str:
        """Add new output tokens; return the text they complete ("" while a character is incomplete)."""
        if not token_ids:
            return ""
        return self._impl.push(token_ids if isinstance(token_ids, list) else list(token_ids))  # read, never kept

    def flush(self) -> str:
        """Return text still held for an incomplete character (as U+FFFD); call when the request ends."""
        return self._impl.flush()

    def finish(self, token_ids: list[int]) -> str:
        """`push(token_ids) + flush()` for a request's last tokens (and those it deferred), in one decode where the
        module docstring says that gives the same text. The detokenizer is spent afterwards."""
        if isinstance(self._impl, _StreamDecoder):
            text = self._impl.one_decode(list(token_ids))
            if text is not None:
                return text
        return self.push(token_ids) + self.flush()

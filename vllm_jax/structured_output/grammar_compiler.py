"""StructuredOutputsParams -> a validated llguidance grammar, compiled once per distinct constraint.

llguidance is vLLM's `guidance` backend. We use it rather than xgrammar (vLLM's default) because xgrammar requires
torch and triton at run time, which a JAX engine would otherwise never install (docs/architecture/08-sampling.md,
"Structured outputs"). Compilation and validation run on the caller's thread (the server's worker threads, not the
engine thread), and results are cached by the constraint's text, so a repeated schema costs a dictionary lookup.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from vllm_jax.sampling_params import StructuredOutputsParams

MAX_CACHED_GRAMMARS = 1024


class GrammarCompiler:
    """Thread-safe: the server compiles from several worker threads while the engine thread makes matchers."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int], *,
                 disable_any_whitespace: bool = False, disable_additional_properties: bool = False):
        """The two flags are the server's defaults (`--structured-outputs-config`); a request may add to them."""
        self._hf_tokenizer = tokenizer
        self._defaults = (disable_any_whitespace, disable_additional_properties)
        self.vocab_size = vocab_size
        self.stop_token_ids = frozenset(int(t) for t in stop_token_ids if t is not None and 0 <= t < vocab_size)
        self._ll_tokenizer: Any = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, str] = OrderedDict()

    @property
    def ll_tokenizer(self) -> Any:
        """llguidance's view of the tokenizer (each token's bytes), built on first use (about a second)."""
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = _make_ll_tokenizer(self._hf_tokenizer, self.vocab_size,
                                                        sorted(self.stop_token_ids))
            return self._ll_tokenizer

    def compile(self, params: StructuredOutputsParams) -> str:
        """The constraint's llguidance grammar (also stored on `params`); ValueError naming the constraint's
        field when the schema, regex or grammar is invalid."""
        if params.is_compiled:
            return params.compiled_grammar
        original, params = params, dataclasses.replace(
            params, disable_any_whitespace=params.disable_any_whitespace or self._defaults[0],
            disable_additional_properties=params.disable_additional_properties or self._defaults[1])
        key = _cache_key(params)
        with self._lock:
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
        if grammar is None:
            grammar = self._build_and_validate(params)
            with self._lock:
                self._cache[key] = grammar
                while len(self._cache) > MAX_CACHED_GRAMMARS:
                    self._cache.popitem(last=False)
        original.compiled_grammar = grammar
        return grammar

    def new_matcher(self, grammar: str) -> Any:
        """A fresh matcher at the grammar's start (one per request: matchers carry the request's progress)."""
        import llguidance

        return llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)

    def _build_and_validate(self, params: StructuredOutputsParams) -> str:
        import llguidance

        field = f"structured_outputs.{params.kind}"
        try:
            grammar = _grammar_text(params)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{field} is invalid: {exc}") from None
        error = llguidance.LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        if error:
            raise ValueError(f"{field} is invalid: {error.strip()}")
        return grammar


def _make_ll_tokenizer(tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> Any:
    import llguidance.hf

    try:
        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=stop_token_ids or None)
    except Exception as exc:  # e.g. a slow (Python) tokenizer, or one larger than the model's vocab
        raise ValueError(f"structured outputs need a fast tokenizer that fits the model's vocabulary of "
                         f"{vocab_size} tokens; this one cannot be used: {exc}") from exc


def _cache_key(params: StructuredOutputsParams) -> str:
    """The constraint and its options as canonical text: a schema given as a dict or as its JSON text is one."""
    value = getattr(params, params.kind)
    if params.kind == "json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pass  # invalid JSON: compiling reports it
    return json.dumps([params.kind, value, params.disable_any_whitespace, params.disable_additional_properties,
                       params.whitespace_pattern], sort_keys=True)


def _grammar_text(params: StructuredOutputsParams) -> str:
    """llguidance's grammar for each kind, with vLLM's JSON options (flexible whitespace unless disabled)."""
    import llguidance

    kind = params.kind
    if kind in ("json", "json_object"):
        schema: Any = {"type": "object"} if kind == "json_object" else params.json
        if isinstance(schema, str):
            schema = json.loads(schema)
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
        if params.disable_additional_properties and isinstance(schema, dict):
            schema = _close_objects(schema)
        options: dict[str, Any] = {"whitespace_flexible": not params.disable_any_whitespace}
        if params.whitespace_pattern is not None:
            options["whitespace_pattern"] = params.whitespace_pattern
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=options)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(params.regex)
    if kind == "choice":
        return llguidance.grammar_from("choice", json.dumps(list(params.choice)))
    return llguidance.grammar_from("grammar", params.grammar)  # EBNF / GBNF, or Lark


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _close_objects(schema: Any) -> Any:
    """vLLM's disable_additional_properties: every object schema that lists `properties` or `patternProperties`
    and says nothing of `additionalProperties` gets `additionalProperties: false`. A bare `{"type": "object"}`
    (any object, as json_object asks) stays open, as in vLLM and in xgrammar's strict mode. The maps of named
    subschemas are walked by value, so a property that happens to be called "properties" is not taken for one."""
    if isinstance(schema, list):
        return [_close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _close_value(key, value) for key, value in schema.items()}
    if isinstance(out.get("properties"), dict) or isinstance(out.get("patternProperties"), dict):
        out.setdefault("additionalProperties", False)
    return out


def _close_value(key: str, value: Any) -> Any:
    """One keyword's value, closed: a map of named subschemas by value, literal JSON values (const, enum, ...)
    as they are, anything else as a schema."""
    if key in _SCHEMA_MAPS and isinstance(value, dict):
        return {name: _close_objects(sub) for name, sub in value.items()}
    if key in ("const", "enum", "default", "examples"):
        return value
    return _close_objects(value)

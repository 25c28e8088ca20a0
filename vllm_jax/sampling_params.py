"""SamplingParams: vLLM's per-request sampling options, validated at construction.

Field names, defaults and meanings follow vLLM so that user code ports unchanged. Validation happens in
`__post_init__` (so `dataclasses.replace` re-validates): every bad value raises a ValueError naming the field
and its allowed range, and a few inputs are normalized the way vLLM does it (stop str -> [str], top_k -1 -> 0,
seed -1 -> None, string logit_bias keys -> int, greedy rows drop top_p/top_k/min_p). Checks that need the vocab
size (token-id ranges) run later, when the engine calls `verify_token_ids(vocab_size)`.
"""

from __future__ import annotations

import copy
import logging
import math
import numbers
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

logger = logging.getLogger(__name__)

_GREEDY_TEMPERATURE = 1e-5  # below this a row is sampled greedily (vLLM's _SAMPLING_EPS)
_MIN_TEMPERATURE = 1e-2  # smaller positive temperatures are raised to this, as vLLM does, to keep logits/T finite
_MAX_ABS_LOGIT_BIAS = 100.0  # vLLM (and OpenAI) clamp logit_bias values to [-100, 100]


_CONSTRAINT_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """vLLM's structured-output constraint: exactly one of json (a JSON schema, as a dict or its text), regex,
    choice (a list of strings), grammar (EBNF / GBNF or Lark), json_object (any JSON object).

    The engine compiles it with llguidance (docs/architecture/08-sampling.md, "Structured outputs"); the compiled
    grammar is kept in `compiled_grammar` (set by the engine's grammar compiler, never by a caller) so that a
    request cloned for n > 1 or retried compiles nothing again.
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None
    disable_fallback: bool = False
    compiled_grammar: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        given = [k for k in _CONSTRAINT_KINDS if getattr(self, k) is not None and getattr(self, k) is not False]
        if len(given) != 1:
            what = ", ".join(given) if given else "none"
            raise ValueError("structured_outputs needs exactly one of json, regex, choice, grammar or json_object; "
                             f"got {what}.")
        kind = given[0]
        if kind == "structural_tag":
            raise ValueError("structured_outputs.structural_tag is not supported; use json, regex, choice or "
                             "grammar.")
        if kind == "json" and not isinstance(self.json, (str, dict)):
            raise ValueError(f"structured_outputs.json must be a JSON schema (an object or its text), got "
                             f"{type(self.json).__name__}.")
        if kind in ("regex", "grammar") and not (isinstance(getattr(self, kind), str) and getattr(self, kind)):
            raise ValueError(f"structured_outputs.{kind} must be a non-empty string.")
        if kind == "choice" and (not isinstance(self.choice, (list, tuple)) or not self.choice
                                 or not all(isinstance(c, str) for c in self.choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of strings.")
        if kind == "json_object" and self.json_object is not True:
            raise ValueError("structured_outputs.json_object must be true when given.")
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise ValueError("structured_outputs.whitespace_pattern must be a string (a regex).")

    @property
    def is_compiled(self) -> bool:
        """Whether the engine's grammar compiler already filled `compiled_grammar` (then compiling again is a
        no-op)."""
        return self.compiled_grammar is not None

    @property
    def kind(self) -> str:
        """Which constraint this is: json, regex, choice, grammar or json_object."""
        return next(k for k in _CONSTRAINT_KINDS if getattr(self, k) is not None and getattr(self, k) is not False)


class RequestOutputKind(IntEnum):
    CUMULATIVE = 0  # every output carries the whole text so far
    DELTA = 1  # streaming: only what is new since the last output
    FINAL_ONLY = 2  # one output when the request finishes (offline LLM.generate)


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None
    # Filled by the engine: bad_words tokenized, and the model's EOS plus generation_config's extra stop ids.
    bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        self.n = _int("n", self.n, minimum=1)
        self.presence_penalty = _real_in("presence_penalty", self.presence_penalty, -2.0, 2.0)
        self.frequency_penalty = _real_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        self.repetition_penalty = _real("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}.")
        self.temperature = _real("temperature", self.temperature)
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}.")
        if _GREEDY_TEMPERATURE <= self.temperature < _MIN_TEMPERATURE:
            logger.warning("temperature %s is below %s; raising it to %s to avoid numerical problems",
                           self.temperature, _MIN_TEMPERATURE, _MIN_TEMPERATURE)
            self.temperature = _MIN_TEMPERATURE
        self.top_p = _real("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        self.top_k = _int("top_k", self.top_k)
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 or -1 (disabled) or >= 1, got {self.top_k}.")
        self.top_k = max(self.top_k, 0)
        self.min_p = _real_in("min_p", self.min_p, 0.0, 1.0)
        self._verify_lengths()
        self.logprobs = _logprob_count("logprobs", self.logprobs)
        self.prompt_logprobs = _logprob_count("prompt_logprobs", self.prompt_logprobs)
        if self.seed is not None:
            self.seed = _int("seed", self.seed)
            if self.seed == -1:  # vLLM's spelling of "no seed"
                self.seed = None
        self._verify_stops()
        self._verify_token_constraints()
        self.output_kind = _output_kind(self.output_kind)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams, got "
                             f"{type(self.structured_outputs).__name__}.")
        if self.temperature < _GREEDY_TEMPERATURE:  # greedy: these filters cannot change the argmax
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        # min_tokens masks every stop id, user-given ones included (the engine adds EOS later).
        self.all_stop_token_ids = set(self.all_stop_token_ids) | set(self.stop_token_ids)

    def _verify_lengths(self) -> None:
        if self.max_tokens is not None:
            self.max_tokens = _int("max_tokens", self.max_tokens, minimum=1)
        self.min_tokens = _int("min_tokens", self.min_tokens, minimum=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens={self.max_tokens}, got {self.min_tokens}.")

    def _verify_stops(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        elif not isinstance(self.stop, (list, tuple)):
            raise ValueError(f"stop must be a string or a list of strings, got {type(self.stop).__name__}.")
        self.stop = list(self.stop)
        for s in self.stop:
            if not isinstance(s, str):
                raise ValueError(f"stop must contain only strings, got {s!r}.")
            if not s:
                raise ValueError("stop cannot contain an empty string.")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True; set detokenize=True to use stop.")
        self.stop_token_ids = _token_id_list("stop_token_ids", self.stop_token_ids, allow_empty=True)

    def _verify_token_constraints(self) -> None:
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(
                    f"logit_bias must be a dict of token id -> bias, got {type(self.logit_bias).__name__}.")
            bias: dict[int, float] = {}
            for key, value in self.logit_bias.items():
                try:
                    token_id = int(key)
                except (TypeError, ValueError):
                    raise ValueError(f"logit_bias keys must be token ids (int-convertible), got {key!r}.") from None
                if token_id < 0:
                    raise ValueError(f"logit_bias keys must be non-negative token ids, got {token_id}.")
                value = _real("logit_bias", value)
                bias[token_id] = min(max(value, -_MAX_ABS_LOGIT_BIAS), _MAX_ABS_LOGIT_BIAS)
            self.logit_bias = bias
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _token_id_list("allowed_token_ids", self.allowed_token_ids, allow_empty=False)
        if self.bad_words is None:
            self.bad_words = []
        if not isinstance(self.bad_words, (list, tuple)) or not all(isinstance(w, str) for w in self.bad_words):
            raise ValueError(f"bad_words must be a list of strings, got {self.bad_words!r}.")
        if any(not w.strip() for w in self.bad_words):
            raise ValueError("bad_words cannot contain an empty or whitespace-only string.")
        self.bad_words = list(self.bad_words)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_TEMPERATURE

    @property
    def reads_output_tokens(self) -> bool:
        """Whether sampling the next token depends on the tokens generated so far (penalties, bad words,
        min_tokens; a grammar too, see `structured_outputs`): async scheduling keeps such a request's newest token
        on the host before its next step (docs/architecture/02-engine.md, "Async scheduling")."""
        return bool(self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
                    or self.bad_words or self.bad_words_token_ids or self.min_tokens > 0
                    or self.structured_outputs is not None)

    def clone(self) -> SamplingParams:
        """A deep copy, so the engine can fill per-request fields without touching the caller's object."""
        return copy.deepcopy(self)

    def verify_token_ids(self, vocab_size: int) -> None:
        """Reject token ids the model cannot produce; called by the engine once it knows the vocab size."""
        groups: list[tuple[str, list[int]]] = [
            ("stop_token_ids", list(self.stop_token_ids or [])),
            ("allowed_token_ids", list(self.allowed_token_ids or [])),
            ("logit_bias", list((self.logit_bias or {}).keys())),
            ("bad_words", [t for word in self.bad_words_token_ids for t in word]),
        ]
        for name, ids in groups:
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"{name} contains token ids outside the vocabulary [0, {vocab_size}): {bad[:10]}.")


def _real(name: str, value: Any) -> float:
    """A finite float, from any real number except bool (True is almost certainly a bug)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}.")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}.")
    return value


def _real_in(name: str, value: Any, low: float, high: float) -> float:
    value = _real(name, value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low:g}, {high:g}], got {value}.")
    return value


def _int(name: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}.")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")
    return value


def _logprob_count(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if value is True:  # vLLM: logprobs=True means "the sampled token plus the top 1"
        return 1
    value = _int(name, value)
    if value == -1:
        raise ValueError(f"{name}=-1 (the whole vocabulary) is not supported; pass a count >= 0.")
    if value < 0:
        raise ValueError(f"{name} must be None or >= 0, got {value}.")
    return value


def _token_id_list(name: str, value: Any, allow_empty: bool) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of token ids, got {type(value).__name__}.")
    if not value and not allow_empty:
        raise ValueError(f"{name} must not be empty.")
    ids = []
    for t in value:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
            raise ValueError(f"{name} must contain only non-negative ints, got {t!r}.")
        ids.append(int(t))
    return ids


def _output_kind(value: Any) -> RequestOutputKind:
    try:
        return RequestOutputKind(value)
    except ValueError:
        allowed = ", ".join(k.name for k in RequestOutputKind)
        raise ValueError(f"output_kind must be one of {allowed}, got {value!r}.") from None

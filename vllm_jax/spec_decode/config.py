"""vLLM's `speculative_config` (`LLM(speculative_config={...})`, `--speculative-config '<json>'`), checked once.

Keys as vLLM spells them: `method` ("ngram", "draft_model", "eagle3"), `num_speculative_tokens` (k),
`prompt_lookup_max` / `prompt_lookup_min` (n-gram), `model` (the draft or EAGLE-3 head), `disable_by_batch_size`
(no proposals while more requests than this are running). Every bad value is a ValueError naming its key
(docs/architecture/08-sampling.md, "Speculative decoding"). Pure Python, no jax.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from vllm_jax.utils import json_object_flag

METHODS = ("ngram", "draft_model", "eagle3")
IMPLEMENTED_METHODS = METHODS
# vLLM's defaults when neither prompt_lookup key is given.
DEFAULT_PROMPT_LOOKUP = 5
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model",
         "disable_by_batch_size")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = DEFAULT_PROMPT_LOOKUP
    prompt_lookup_min: int = DEFAULT_PROMPT_LOOKUP
    model: str | None = None
    # Proposals stop while more than this many requests run (None: never). Not given: the platform's default
    # (config/platform_defaults.py; docs/speculative-decoding.md, "Measurements").
    disable_by_batch_size: int | None = None

    @classmethod
    def parse(cls, value: str | dict | None) -> SpeculativeConfig | None:
        """From the flag's JSON text or a dict (None: speculation off)."""
        if value is None:
            return None
        value = json_object_flag("speculative_config", value, _KEYS)
        method = value.get("method")
        if method is None:
            raise ValueError(f"speculative_config.method is required: one of {', '.join(METHODS)}")
        if method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {', '.join(METHODS)}; got {method!r}")
        k = _positive_int(value, "num_speculative_tokens", required=True)
        lookup_max = _positive_int(value, "prompt_lookup_max")
        lookup_min = _positive_int(value, "prompt_lookup_min")
        if lookup_max is None and lookup_min is None:
            lookup_max = lookup_min = DEFAULT_PROMPT_LOOKUP
        lookup_max = lookup_max if lookup_max is not None else lookup_min
        lookup_min = lookup_min if lookup_min is not None else lookup_max
        if lookup_min > lookup_max:
            raise ValueError(f"speculative_config.prompt_lookup_min ({lookup_min}) must be <= prompt_lookup_max "
                             f"({lookup_max})")
        model = value.get("model")
        if method == "ngram":
            if model is not None:
                raise ValueError("speculative_config.model is not used by method 'ngram' (it proposes from the "
                                 "request's own tokens); drop the key")
        else:
            _check_draft_model(method, model)
        disable = _positive_int(value, "disable_by_batch_size")
        return cls(method=method, num_speculative_tokens=k, prompt_lookup_max=lookup_max,
                   prompt_lookup_min=lookup_min, model=model, disable_by_batch_size=disable)

    def check_fits(self, max_num_batched_tokens: int, max_model_len: int) -> None:
        """A decoding request schedules 1 + k tokens: they must fit one step and the context. Their logits rows
        are bounded by the step's tokens, not by max_num_seqs (worker/buckets.py's `max_step_rows`)."""
        need = 1 + self.num_speculative_tokens
        for name, limit in (("max_num_batched_tokens", max_num_batched_tokens), ("max_model_len", max_model_len)):
            if need > limit:
                raise ValueError(f"speculative_config.num_speculative_tokens ({self.num_speculative_tokens}) is too "
                                 f"large: a decoding request then needs {need} tokens per step, more than {name} "
                                 f"({limit})")
        if self.method not in IMPLEMENTED_METHODS:
            raise ValueError(f"speculative_config.method {self.method!r} is not available in this build yet (only "
                             f"{', '.join(IMPLEMENTED_METHODS)}); see docs/speculative-decoding.md")


def _positive_int(value: dict, key: str, required: bool = False) -> int | None:
    got = value.get(key)
    if got is None:
        if required:
            raise ValueError(f"speculative_config.{key} is required (a positive integer)")
        return None
    if not isinstance(got, int) or isinstance(got, bool) or got < 1:
        raise ValueError(f"speculative_config.{key} must be a positive integer; got {got!r}")
    return got


def _check_draft_model(method: str, model: object) -> None:
    """A draft model or EAGLE-3 head must name a local directory holding a config and weights."""
    if not isinstance(model, str) or not model:
        raise ValueError(f"speculative_config.model is required for method {method!r}: the path of the "
                         f"{'draft model' if method == 'draft_model' else 'EAGLE-3 head'}")
    if not os.path.isdir(model):
        raise ValueError(f"speculative_config.model {model!r}: no such directory")
    if not os.path.isfile(os.path.join(model, "config.json")):
        raise ValueError(f"speculative_config.model {model!r} has no config.json")
    if not any(name.endswith((".safetensors", ".bin")) for name in os.listdir(model)):
        raise ValueError(f"speculative_config.model {model!r} holds no weights (*.safetensors or *.bin)")

"""SamplingParams: vLLM's per-request sampling options, validated at construction.

Field names, defaults and meanings follow vLLM so that user code ports unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


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
    # Filled by the engine: bad_words tokenized, and the model's EOS plus generation_config's extra stop ids.
    bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_TEMPERATURE


_GREEDY_TEMPERATURE = 1e-5

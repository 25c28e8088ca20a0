"""One request's grammar state: its llguidance matcher, advanced with every token the request samples.

With a reasoning parser the constraint starts after the reasoning ends: tokens up to and including the end
token (e.g. `</think>`) are free and not fed to the matcher, as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ReasoningTokens:
    """The reasoning parser's start and end token ids (start may be absent from a template's prompt)."""

    start_id: int | None
    end_id: int

    def ended(self, token_ids: list[int]) -> bool:
        """Whether the last reasoning section in `token_ids` is closed (or a start never opened one, and an end
        followed whatever came before)."""
        last_end = _last_index(token_ids, self.end_id)
        last_start = _last_index(token_ids, self.start_id) if self.start_id is not None else -1
        return last_end > last_start


class RequestGrammar:
    def __init__(self, matcher: Any, width: int, stop_token_ids: frozenset[int],
                 reasoning: ReasoningTokens | None = None, prompt_token_ids: list[int] | None = None):
        self.matcher = matcher
        self.width = width
        self.stop_token_ids = stop_token_ids  # the EOS tokens a complete grammar allows
        self.reasoning = reasoning
        self.reasoning_ended = reasoning is None or reasoning.ended(list(prompt_token_ids or []))

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and admits nothing more (the matcher would force EOS)."""
        return self.reasoning_ended and bool(self.matcher.is_stopped())

    def next_token_bitmask(self) -> np.ndarray | None:
        """The allowed next tokens as int32 words (bit t % 32 of word t // 32); None while the row is free
        (reasoning not ended yet)."""
        if not self.reasoning_ended:
            return None
        import llguidance.numpy as llnp

        mask = np.zeros((1, self.width), np.int32)
        llnp.fill_next_token_bitmask(self.matcher, mask)
        return mask[0]

    def accept(self, token_id: int) -> bool:
        """Advance past a sampled token; False when the matcher rejects it (the request's grammar is broken)."""
        if not self.reasoning_ended:
            if self.reasoning is not None and token_id == self.reasoning.end_id:
                self.reasoning_ended = True
            return True
        return bool(self.matcher.consume_token(int(token_id)))


def _last_index(token_ids: list[int], token_id: int | None) -> int:
    for i in range(len(token_ids) - 1, -1, -1):
        if token_ids[i] == token_id:
            return i
    return -1

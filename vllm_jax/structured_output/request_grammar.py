"""One request's grammar state: its llguidance matcher, advanced with every token the request samples.

With a reasoning parser the constraint starts after the reasoning ends: tokens up to and including the end
token (e.g. `</think>`) are free and not fed to the matcher, as vLLM does.

Speculative decoding verifies a request's proposals in one step, so the scheduler asks for one bitmask per
verified position: the matcher walks the proposals tentatively and is rolled back (docs/architecture/08-sampling.md,
"Speculative decoding").
"""

from __future__ import annotations

from collections.abc import Sequence
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

    def allowed_prefix(self, proposals: Sequence[int]) -> int:
        """How many leading `proposals` the grammar allows in a row: one past them can never be accepted, so the
        scheduler drops it and those after it. Cheap (no bitmask); conservative where llguidance is (an EOS
        after a completed grammar counts as forbidden)."""
        free = 0 if self.reasoning_ended else _free_prefix(proposals, self.reasoning)
        if free == len(proposals):
            return free
        return free + int(self.matcher.validate_tokens([int(t) for t in proposals[free:]]))

    def bitmasks_along(self, proposals: Sequence[int]) -> np.ndarray | None:
        """[1 + len(proposals), width] int32: row j is the bitmask after proposals[:j] (all ones while free), so
        each verified position is masked as if the proposals before it were sampled; None when every row is
        free. The matcher advances tentatively and is rolled back. Past a stop token or a proposal its row
        forbids, rows repeat the last one: verification stops or rejects there, so they are never emitted."""
        was_ended, consumed = self.reasoning_ended, 0
        rows = [self.next_token_bitmask()]
        try:
            for token in proposals:
                if self.reasoning_ended:
                    if token in self.stop_token_ids or not _allows(rows[-1], token):
                        break
                    if not self.matcher.consume_token(int(token)):
                        break
                    consumed += 1
                else:
                    self.accept(token)
                rows.append(self.next_token_bitmask())
        finally:
            if consumed:
                self.matcher.rollback(consumed)
            self.reasoning_ended = was_ended
        rows += [rows[-1]] * (len(proposals) + 1 - len(rows))
        if all(row is None for row in rows):
            return None
        return np.stack([np.full(self.width, -1, np.int32) if row is None else row for row in rows])


def _allows(row: np.ndarray | None, token_id: int) -> bool:
    """Whether a bitmask row (None: free) allows `token_id` (bit t % 32 of word t // 32)."""
    if row is None:
        return True
    word = token_id >> 5
    return 0 <= word < len(row) and bool((int(row[word]) >> (token_id & 31)) & 1)


def _free_prefix(token_ids: Sequence[int], reasoning: ReasoningTokens | None) -> int:
    """How many leading tokens are still reasoning (free): up to and including the end token, else all."""
    for i, token_id in enumerate(token_ids):
        if reasoning is not None and token_id == reasoning.end_id:
            return i + 1
    return len(token_ids)


def _last_index(token_ids: list[int], token_id: int | None) -> int:
    for i in range(len(token_ids) - 1, -1, -1):
        if token_ids[i] == token_id:
            return i
    return -1

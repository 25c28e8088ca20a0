"""N-gram (prompt lookup) proposals for speculative decoding: pure numpy, no jax.

vLLM's `{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": N, "prompt_lookup_min": M}`: the
longest suffix of a request's tokens (prompt + output), from N tokens down to M, that also occurs earlier in them
proposes the (up to k) tokens that followed its most recent earlier occurrence. Input-grounded generation
(rewriting a passage, editing code, summaries that quote) repeats its context, so the proposals are often right.

One vectorized comparison over the context finds where the last token occurred; the candidates then grow one
suffix token at a time, each step a comparison over the (shrinking) candidates, so the cost per request is a few
numpy calls however long the context is: no Python loop over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NgramProposer:
    num_speculative_tokens: int  # k: at most this many tokens proposed per request and step
    prompt_lookup_max: int  # the longest suffix tried
    prompt_lookup_min: int  # the shortest suffix that may still propose

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1; got {self.num_speculative_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max; got prompt_lookup_min="
                             f"{self.prompt_lookup_min}, prompt_lookup_max={self.prompt_lookup_max}")

    def propose(self, token_ids: np.ndarray, max_tokens: int | None = None) -> np.ndarray:
        """The proposal for one request whose known tokens are `token_ids` (1-D): int32, possibly empty.

        `max_tokens` caps it further (the request's remaining budget of output tokens or context)."""
        tokens = np.asarray(token_ids)
        limit = self.num_speculative_tokens if max_tokens is None else min(self.num_speculative_tokens, max_tokens)
        last = tokens.shape[0] - 1
        if limit <= 0 or last < 1:
            return np.zeros(0, np.int32)
        # Ends of earlier windows matching the suffix, grown one token at a time (1-gram, 2-gram, ...): one
        # comparison over the context, then over the shrinking set of candidates.
        ends = np.flatnonzero(tokens[:last] == tokens[last])
        best = -1
        for n in range(1, self.prompt_lookup_max + 1):
            if not ends.size:
                break
            if n >= self.prompt_lookup_min:
                best = int(ends[-1])  # the most recent occurrence of the longest suffix so far
            ends = ends[ends >= n]
            ends = ends[tokens[ends - n] == tokens[last - n]] if n <= last else ends[:0]
        if best < 0:
            return np.zeros(0, np.int32)
        return tokens[best + 1:best + 1 + limit].astype(np.int32)

    def propose_rows(self, token_ids: np.ndarray, num_tokens: np.ndarray,
                     max_tokens: np.ndarray | None = None) -> list[np.ndarray]:
        """`propose` for each row of a [R, W] token buffer whose row i holds `num_tokens[i]` known tokens (the
        runner's input batch), each capped by `max_tokens[i]` when given."""
        caps = [None] * len(num_tokens) if max_tokens is None else [int(m) for m in max_tokens]
        return [self.propose(token_ids[i, :int(n)], caps[i]) for i, n in enumerate(num_tokens)]

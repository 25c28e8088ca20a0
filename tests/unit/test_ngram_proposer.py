"""The n-gram (prompt lookup) proposer: longest suffix first, its most recent earlier occurrence, at most k
tokens and the caller's cap; against a plain-Python reference on random contexts."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_jax.spec_decode.ngram import NgramProposer


def _reference(tokens: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # latest occurrence before the suffix itself
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_the_longest_suffix_wins_and_its_latest_occurrence_proposes():
    proposer = NgramProposer(num_speculative_tokens=3, prompt_lookup_max=3, prompt_lookup_min=1)
    # "7 8 9" occurs once before the end (followed by 1 2 3); "8 9" alone also occurs later (followed by 5).
    tokens = [7, 8, 9, 1, 2, 3, 8, 9, 5, 0, 7, 8, 9]
    assert proposer.propose(np.array(tokens)).tolist() == [1, 2, 3]
    # Only a 1-gram matches: its latest occurrence, and what follows it up to the end
    assert proposer.propose(np.array([4, 1, 5, 1, 6, 1])).tolist() == [6, 1]


def test_no_match_too_short_a_context_or_no_budget_proposes_nothing():
    proposer = NgramProposer(num_speculative_tokens=4, prompt_lookup_max=4, prompt_lookup_min=2)
    assert proposer.propose(np.array([1, 2, 3, 4, 5])).size == 0  # no repeated 2-gram
    assert proposer.propose(np.array([1])).size == 0
    assert proposer.propose(np.array([1, 2, 1, 2]), max_tokens=0).size == 0
    assert proposer.propose(np.array([1, 2, 3, 1, 2]), max_tokens=1).tolist() == [3]
    # A match near the end proposes what follows it, fewer than k tokens
    assert proposer.propose(np.array([5, 6, 5, 6])).tolist() == [5, 6]


@pytest.mark.parametrize("k, n_max, n_min", [(1, 1, 1), (3, 4, 2), (5, 3, 1), (2, 5, 5)])
def test_equals_a_plain_python_reference_on_random_contexts(k, n_max, n_min):
    rng = np.random.default_rng(k * 100 + n_max * 10 + n_min)
    proposer = NgramProposer(num_speculative_tokens=k, prompt_lookup_max=n_max, prompt_lookup_min=n_min)
    proposed = 0
    for _ in range(300):
        vocab = 2 if n_min >= 4 else 4  # tiny vocabularies: many repeats
        tokens = rng.integers(0, vocab, int(rng.integers(1, 40))).tolist()
        got = proposer.propose(np.array(tokens, np.int32))
        assert got.dtype == np.int32 and got.tolist() == _reference(tokens, k, n_max, n_min)
        proposed += got.size > 0
    assert proposed >= 50  # the cases did exercise matches


def test_rows_of_a_token_buffer_are_proposed_each_within_its_length_and_cap():
    proposer = NgramProposer(num_speculative_tokens=2, prompt_lookup_max=2, prompt_lookup_min=1)
    buffer = np.zeros((3, 10), np.int32)
    buffer[0, :6] = [1, 2, 3, 1, 2, 9]  # the 9 after the end is never read: length 5
    buffer[1, :3] = [4, 5, 6]
    buffer[2, :4] = [8, 8, 8, 8]
    got = proposer.propose_rows(buffer, np.array([5, 3, 4]), max_tokens=np.array([2, 2, 1]))
    assert [g.tolist() for g in got] == [[3, 1], [], [8]]


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_speculative_tokens=0, prompt_lookup_max=3, prompt_lookup_min=1), "num_speculative_tokens"),
    (dict(num_speculative_tokens=2, prompt_lookup_max=2, prompt_lookup_min=3), "prompt_lookup_min"),
    (dict(num_speculative_tokens=2, prompt_lookup_max=2, prompt_lookup_min=0), "prompt_lookup_min"),
])
def test_bad_settings_are_refused_naming_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NgramProposer(**kwargs)

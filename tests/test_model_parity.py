"""Our decoder against transformers (PyTorch CPU, float32) on the same tiny random weights."""

from __future__ import annotations

import pytest

from tests.parity import (assert_greedy_matches_transformers, assert_logits_match_over_two_chunked_steps,
                          ragged_sequences)
from tests.tiny_models import ARCHS, make_tiny_checkpoint


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_logits_match_transformers_on_ragged_chunked_batches(arch, tmp_path):
    """Four sequences of different lengths, each split into two chunks over two steps (the second step reads
    the first step's KV from the pages), mixed with a decode-sized row: every computed position's logits
    match transformers within 1e-4."""
    hf = make_tiny_checkpoint(arch, tmp_path)
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences())


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_greedy_continuation_of_32_tokens_is_token_identical(arch, tmp_path):
    hf = make_tiny_checkpoint(arch, tmp_path, seed=3)
    assert_greedy_matches_transformers(hf, tmp_path)

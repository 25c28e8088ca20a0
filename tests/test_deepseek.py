"""DeepSeek-V2 / V3 (MLA, grouped routing, shared experts, dense first layers) against transformers."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.parity import (assert_greedy_matches_transformers, assert_logits_match_over_two_chunked_steps,
                                  load_forward, ragged_sequences)
from tests.helpers.tiny_models import make_tiny_checkpoint


@pytest.mark.parametrize("arch", ["deepseek_v3", "deepseek_v2"])
def test_logits_match_transformers_on_ragged_chunked_batches(arch, tmp_path):
    hf = make_tiny_checkpoint(arch, tmp_path)
    spec = load_forward(tmp_path)[0]
    assert spec.architecture == hf.config.architectures[0]
    assert spec.kv_cache_heads == 1 and spec.kv_cache_width == 32 + 8
    assert spec.moe_layers[0] is False and all(spec.moe_layers[1:])
    assert_logits_match_over_two_chunked_steps(hf, tmp_path, ragged_sequences())

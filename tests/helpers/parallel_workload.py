"""The small workload the parallelism tests run (shared by the subprocess scripts; no environment side effects)."""

from __future__ import annotations

import numpy as np

from tests.helpers.tiny_models import VOCAB_SIZE

# one token bucket and one sequence bucket: each engine compiles one forward (docs/contributing/testing.md,
# "Compile time")
ENGINE_ARGS = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=64, max_num_seqs=8,
                   max_num_batched_tokens=32, min_token_bucket=32, min_seq_bucket=8)


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(3, VOCAB_SIZE, n).tolist() for n in (5, 20, 33)]

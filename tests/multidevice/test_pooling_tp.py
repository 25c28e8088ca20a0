"""The multi-device tests of tests/engine/test_pooling.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

import numpy as np

from tests.engine.test_pooling import (
    SMALL,
    TEXTS,
    st_model,  # noqa: F401  (a fixture)
)
from vllm_jax import LLM


def test_tp2_embeddings_equal_tp1(st_model):  # noqa: F811
    """Tensor parallelism over two of the session's fake CPU devices: the sharded forward, the replicated pooler."""
    path, llm = st_model
    tp2 = LLM(str(path), tensor_parallel_size=2, **SMALL)
    for a, b in zip(tp2.embed(TEXTS, use_tqdm=False), llm.embed(TEXTS, use_tqdm=False)):
        np.testing.assert_allclose(a.outputs.embedding, b.outputs.embedding, atol=1e-5)

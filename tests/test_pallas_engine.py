"""The whole engine through each Pallas kernel (interpret mode on CPU) gives the XLA backend's greedy tokens.

The tiny Mistral has a sliding window (7) on every layer, so the traced per-layer window, chunked prefill
(32-token steps), decode rows, the layer-stacked KV write and padding rows all go through the kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.tiny_models import VOCAB_SIZE, make_tiny_checkpoint
from vllm_jax import LLM, SamplingParams

ENGINE_ARGS = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=32, max_num_seqs=8,
                   max_num_batched_tokens=32)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_mistral")
    make_tiny_checkpoint("mistral", path, seed=3)
    return str(path)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(5)
    return [rng.integers(3, VOCAB_SIZE, int(n)).tolist() for n in (3, 17, 29, 9, 12)]


def _greedy(checkpoint: str, prompts: list[list[int]], backend: str) -> list[list[int]]:
    llm = LLM(checkpoint, attention_backend=backend, **ENGINE_ARGS)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def xla_tokens(checkpoint, prompts):
    return _greedy(checkpoint, prompts, "xla")


@pytest.mark.parametrize("backend", ["pallas_tpu", "pallas_gpu"])
def test_greedy_generation_through_pallas_kernel_equals_xla_backend(checkpoint, prompts, xla_tokens, backend):
    tokens = _greedy(checkpoint, prompts, backend)
    assert all(len(t) == GREEDY.max_tokens for t in tokens)
    assert tokens == xla_tokens

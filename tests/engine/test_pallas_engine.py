"""The whole engine through each Pallas kernel (interpret mode on CPU) gives the XLA backend's greedy tokens.

The tiny Mistral has a sliding window (7) on every layer, so the traced per-layer window, chunked prefill
(32-token steps), decode rows, the layer-stacked KV write and padding rows all go through the kernels. Its
head_dim is 64 (2 KV heads), so pallas_tpu runs its lane-dense cache's pair-window path (kv_layout.py).
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
    make_tiny_checkpoint("mistral", path, seed=3, head_dim=64)
    return str(path)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(5)
    return [rng.integers(3, VOCAB_SIZE, int(n)).tolist() for n in (3, 17, 29, 9, 12)]


def _greedy(checkpoint: str, prompts: list[list[int]], backend: str) -> list[list[int]]:
    # one bucket (both backends alike): one forward to compile per engine
    llm = LLM(checkpoint, attention_backend=backend, min_token_bucket=32, min_seq_bucket=8, **ENGINE_ARGS)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def xla_tokens(checkpoint, prompts):
    return _greedy(checkpoint, prompts, "xla")


@pytest.mark.parametrize("backend", ["pallas_tpu", "pallas_gpu"])
def test_greedy_generation_through_pallas_kernel_equals_xla_backend(checkpoint, prompts, xla_tokens, backend):
    tokens = _greedy(checkpoint, prompts, backend)
    assert all(len(t) == GREEDY.max_tokens for t in tokens)
    assert tokens == xla_tokens


@pytest.mark.parametrize("platform, lowering, marker, width", [("tpu", "tpu", "tpu_custom_call", 128),
                                                               ("gpu", "cuda", "triton", 8)])
def test_a_runner_built_for_an_accelerator_on_this_cpu_host_lowers_to_its_kernel(checkpoint, platform, lowering,
                                                                                 marker, width):
    """`auto` on a tpu / gpu platform config is the real kernel (not interpret mode, not xla) in the runner's
    forward, lowered here for that chip; the TPU kernel's block table is 128 columns wide."""
    from tests.helpers.lowering import lowered_forward_text
    from vllm_jax import EngineArgs
    from vllm_jax.worker.model_runner import ModelRunner

    args = EngineArgs(model=checkpoint, compilation_cache=False, **ENGINE_ARGS)
    runner = ModelRunner(args.create_config(platform=platform), random_weights=True)
    assert runner.attention_backend.name == f"pallas_{platform}" and runner.max_blocks_per_seq == width
    assert marker in lowered_forward_text(runner, 16, 8, lowering)

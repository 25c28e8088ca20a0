"""Qwen3.5 (gated DeltaNet + gated attention, a state per sequence: docs/architecture/17-state-cache.md) through the
engine, against transformers' own torch code on a tiny random checkpoint: greedy continuations through a cache small
enough to preempt, with prompts chunked over several steps, batched equal to one by one; the features a recurrent
state cannot run with yet refused by name. (Its logits on ragged chunked batches, its batch invariance: the family
tests, tests/engine/test_family_units.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.tiny_models import VOCAB_SIZE, hf_greedy, make_tiny_checkpoint
from vllm_jax import EngineArgs, SamplingParams
from vllm_jax.engine.llm_engine import LLMEngine

MAX_TOKENS = 24
# 8-token blocks, at most 6 per request (48 tokens); 10 blocks hold a request and a half, so five prompts of up to
# 24 tokens with 24 new tokens each preempt; 16 tokens per step chunk every prompt longer than that
ENGINE = dict(max_model_len=48, block_size=8, max_num_seqs=4, max_num_batched_tokens=16, num_gpu_blocks_override=10,
              min_token_bucket=16, min_seq_bucket=4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5")
    return make_tiny_checkpoint("qwen3_5", path, randomize_norms=True), path


def greedy(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        tokens.update((out.request_id, out.outputs[0].token_ids) for out in engine.step() if out.finished)
    return [tokens[str(i)] for i in range(len(prompts))]


def test_greedy_equals_transformers_through_preemption_and_chunked_prefill(checkpoint):
    hf, path = checkpoint
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, VOCAB_SIZE, n).tolist() for n in (7, 23, 1, 18, 12)]
    engine = LLMEngine(EngineArgs(model=str(path), **ENGINE).create_config(), warmup=False)
    assert not engine.config.cache_config.enable_prefix_caching  # off for a hybrid model (logged)
    batched = greedy(engine, prompts)
    assert engine.scheduler.num_preemptions_total > 0, "the small cache did not preempt"
    assert batched == [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]
    one_by_one = [greedy(engine, [p])[0] for p in prompts[:2]]
    assert one_by_one == batched[:2]
    assert engine.kv_cache_manager.state_slots.num_free == ENGINE["max_num_seqs"]  # every slot given back


@pytest.mark.parametrize("flags, named", [
    (dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}),
     "speculative_config"),
    (dict(enable_lora=True), "enable_lora"),
    (dict(num_scheduler_steps=4), "num_scheduler_steps"),
])
def test_features_that_need_a_state_rolled_back_are_refused_by_name(checkpoint, flags, named):
    _, path = checkpoint
    with pytest.raises(ValueError, match=named):
        EngineArgs(model=str(path), **ENGINE, **flags).create_config()

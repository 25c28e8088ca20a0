"""The hybrid families (Qwen3.5: gated DeltaNet + gated attention; Granite 4.0-H: Mamba2 + attention; a state per
sequence: docs/architecture/17-state-cache.md) through the engine, against transformers' own torch code on tiny
random checkpoints: greedy continuations through a cache small
enough to preempt, with prompts chunked over several steps, batched equal to one by one; the features a recurrent
state cannot run with yet refused by name. (Its logits on ragged chunked batches, its batch invariance: the family
tests, tests/engine/test_family_units.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.tiny_models import VOCAB_SIZE, hf_greedy, make_tiny_checkpoint
from vllm_jax import EngineArgs, SamplingParams
from vllm_jax.engine.llm_engine import LLMEngine
from vllm_jax.models.registry import FAMILIES

MAX_TOKENS = 24
# 8-token blocks, at most 6 per request (48 tokens); 10 blocks hold a request and a half, so five prompts of up to
# 24 tokens with 24 new tokens each preempt; 16 tokens per step chunk every prompt longer than that
ENGINE = dict(max_model_len=48, block_size=8, max_num_seqs=4, max_num_batched_tokens=16, num_gpu_blocks_override=10,
              min_token_bucket=16, min_seq_bucket=4)


HYBRID = sorted(name for family in FAMILIES if family.recurrent_state for name in family.tiny_configs
                if not name.endswith("_rope"))  # the rope variant differs only in the layer math (family tests)


@pytest.fixture(scope="module", params=HYBRID)
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return make_tiny_checkpoint(request.param, path, randomize_norms=True), path


def greedy(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in run(engine, prompts)]


def run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = MAX_TOKENS) -> list:
    """Each prompt's finished RequestOutput (`max_tokens` greedy tokens), in the prompts' order."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((out.request_id, out) for out in engine.step() if out.finished)
    return [finished[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("caching", [True, False])
def test_greedy_equals_transformers_through_preemption_and_chunked_prefill(checkpoint, caching):
    """With prefix caching on, two prompts share a two-block prefix: the second (admitted in a later step) starts
    from the first one's state snapshot."""
    hf, path = checkpoint
    rng = np.random.default_rng(5)
    shared = rng.integers(3, VOCAB_SIZE, 16).tolist()
    prompts = [rng.integers(3, VOCAB_SIZE, n).tolist() for n in (7, 23, 1)] + [shared + [5, 6], shared + [7]]
    engine = LLMEngine(EngineArgs(model=str(path), **ENGINE, enable_prefix_caching=caching).create_config(),
                       warmup=False)
    batched = greedy(engine, prompts)
    assert engine.scheduler.num_preemptions_total > 0, "the small cache did not preempt"
    assert batched == [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]
    assert (engine.kv_cache_manager.prefix_cache_hits > 0) == caching
    one_by_one = [greedy(engine, [p])[0] for p in prompts[:2]]
    assert one_by_one == batched[:2]
    # every live slot given back (snapshots may keep theirs)
    assert engine.kv_cache_manager.state_slots_of("0")[0] == 0


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_repeated_and_an_extended_prompt_hit_the_cache_and_generate_the_same(checkpoint, async_scheduling):
    """vLLM's multi-turn pattern on a hybrid model: the same prompt again reports cached tokens (its two full
    blocks), and so does the next turn (prompt, answer, a new message) from the first turn's decode snapshots;
    both generate exactly what transformers does. With async scheduling a decode step's snapshot is written
    before its block's last token is known and bound to the block's hash a step later."""
    hf, path = checkpoint
    rng = np.random.default_rng(9)
    prompt = rng.integers(3, VOCAB_SIZE, 19).tolist()  # two full 8-token blocks and 3 tokens
    args = EngineArgs(model=str(path), **ENGINE, async_scheduling=async_scheduling)
    engine = LLMEngine(args.create_config(), warmup=False)
    first = run(engine, [prompt])[0]
    again = run(engine, [prompt])[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == 16
    reference = hf_greedy(hf, prompt, MAX_TOKENS)
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == reference
    turn = prompt + reference[:-1] + [7]  # 43 tokens: 5 full blocks, the last kept at the first turn's decode
    extended = run(engine, [turn], max_tokens=4)[0]
    assert extended.num_cached_tokens == 40
    assert extended.outputs[0].token_ids == hf_greedy(hf, turn, 4)


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

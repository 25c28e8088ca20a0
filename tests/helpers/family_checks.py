"""Engine-level checks shared by the family tests (tests/test_families.py): greedy continuations equal to
transformers' through a cache small enough to preempt with prefix caching on, and through a roomy cache with it
off."""

from __future__ import annotations

import numpy as np

from tests.helpers.tiny_models import VOCAB_SIZE, hf_greedy

MAX_TOKENS = 32
# 8-token blocks, 12 of them per 96-token request: 16 blocks hold one request and a bit, so six prompts with 32
# new tokens each preempt
ENGINE = dict(max_model_len=96, block_size=8, max_num_seqs=8, max_num_batched_tokens=32)


def engine_prompts() -> list[list[int]]:
    """Prompts of 7, 30 and 1 tokens, then four sharing a 24-token prefix (three full blocks to hit)."""
    rng = np.random.default_rng(2)
    shared = rng.integers(3, VOCAB_SIZE, 24).tolist()
    return ([rng.integers(3, VOCAB_SIZE, n).tolist() for n in (7, 30, 1)]
            + [shared + rng.integers(3, VOCAB_SIZE, 5).tolist() for _ in range(4)])


def assert_engine_greedy_matches(hf, path) -> None:
    """32 greedy tokens per prompt, token-identical to transformers', (a) with prefix caching on and a KV cache
    that preempts (the shared prefix is hit, at least one request is preempted), (b) prefix caching off, no
    preemption."""
    from vllm_jax import LLM, SamplingParams

    prompts = engine_prompts()
    reference = [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for overrides in (dict(enable_prefix_caching=True, num_gpu_blocks_override=16),
                      dict(enable_prefix_caching=False, num_gpu_blocks_override=128)):
        llm = LLM(str(path), **ENGINE, **overrides)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outputs] == reference, overrides
        engine = llm.llm_engine
        if overrides["enable_prefix_caching"]:
            assert engine.scheduler.num_preemptions_total > 0, "the small cache did not preempt"
            assert engine.kv_cache_manager.prefix_cache_hits > 0, "the shared prefix was never hit"
        else:
            assert engine.scheduler.num_preemptions_total == 0

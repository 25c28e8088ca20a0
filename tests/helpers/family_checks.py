"""Engine-level checks shared by the family tests (tests/engine/test_families.py): greedy continuations equal to
transformers' through a KV cache small enough to preempt, with prefix caching on and off."""

from __future__ import annotations

import numpy as np

from tests.helpers.tiny_models import VOCAB_SIZE, hf_greedy

MAX_TOKENS = 32
# 8-token blocks, 8 per 64-token request (within Phi-3's tiny original context: short LongRoPE factors, as
# transformers' generate uses for these lengths): 12 blocks hold one request and a half, so seven prompts with 32
# new tokens each preempt
# One bucket each: every step compiles to the same programs (docs/contributing/testing.md, "Compile time").
ENGINE = dict(max_model_len=64, block_size=8, max_num_seqs=8, max_num_batched_tokens=32, num_gpu_blocks_override=12,
              min_token_bucket=32, min_seq_bucket=8)


def engine_prompts() -> list[list[int]]:
    """Prompts of 7, 30 and 1 tokens, then four sharing a 24-token prefix (three full blocks to hit)."""
    rng = np.random.default_rng(2)
    shared = rng.integers(3, VOCAB_SIZE, 24).tolist()
    return ([rng.integers(3, VOCAB_SIZE, n).tolist() for n in (7, 30, 1)]
            + [shared + rng.integers(3, VOCAB_SIZE, 5).tolist() for _ in range(4)])


def engine_greedy(engine, prompts: list[list[int]], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    """`max_tokens` greedy tokens of each prompt through `engine` (an LLMEngine), in the prompts' order."""
    from vllm_jax import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        tokens.update((out.request_id, out.outputs[0].token_ids) for out in engine.step() if out.finished)
    return [tokens[str(i)] for i in range(len(prompts))]


def assert_engine_greedy_matches(hf, path) -> None:
    """32 greedy tokens per prompt, token-identical to transformers', through a KV cache that preempts, with
    prefix caching on (the shared prefix is hit) and off."""
    from vllm_jax import EngineArgs
    from vllm_jax.engine.llm_engine import LLMEngine

    prompts = engine_prompts()
    reference = [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]
    for overrides in (dict(enable_prefix_caching=True), dict(enable_prefix_caching=False)):
        # no warm-up: only the programs this workload runs are compiled (the warm-up compiles every bucket)
        # the same cache size both times: the second engine loads the first one's programs from the compilation
        # cache (tests/conftest.py)
        engine = LLMEngine(EngineArgs(model=str(path), **ENGINE, **overrides).create_config(), warmup=False)
        assert engine_greedy(engine, prompts) == reference, overrides
        assert engine.scheduler.num_preemptions_total > 0, "the small cache did not preempt"
        if overrides["enable_prefix_caching"]:
            assert engine.kv_cache_manager.prefix_cache_hits > 0, "the shared prefix was never hit"

"""What the speculative-decoding tests check on every engine: the tokens it generates, and that it ends idle."""

from __future__ import annotations

from vllm_jax import LLM


def token_ids(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def check_idle(llm: LLM) -> None:
    """Every block back in the pool (the draft's or head's cache shares them) and no request left anywhere."""
    engine = llm.llm_engine
    assert engine.kv_cache_manager.num_free_blocks == engine.kv_cache_manager.num_usable_blocks
    assert not engine.scheduler.requests and not engine.runner.requests

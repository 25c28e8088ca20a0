"""KV exhaustion through the real engine (LLM.generate on a tiny random Llama with a 19-block cache): requests are
preempted and recomputed, no request is preempted again before it samples a new token, greedy outputs still equal
transformers', and every block is free afterwards. The scheduler-level proofs are in tests/unit/test_scheduler.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.tiny_models import VOCAB_SIZE, hf_greedy, make_tiny_checkpoint
from vllm_jax import LLM, SamplingParams

MAX_TOKENS = 24
NUM_BLOCKS = 20  # 19 usable blocks of 8 tokens for up to 8 requests of up to 73 tokens


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("anti_thrashing")
    return path, make_tiny_checkpoint("llama", path, seed=7)


def test_kv_starved_engine_keeps_transformers_greedy_outputs_and_never_thrashes(checkpoint) -> None:
    path, hf = checkpoint
    llm = LLM(str(path), max_model_len=128, block_size=8, num_gpu_blocks_override=NUM_BLOCKS, max_num_seqs=8,
              max_num_batched_tokens=32, min_token_bucket=32, min_seq_bucket=8)  # one bucket: one forward
    engine = llm.llm_engine
    sched = engine.scheduler
    preempted_awaiting_progress: list[str] = []
    rule_decided = [0]  # victim picks where fcfs's plain choice (the last running request) had not progressed yet
    pick, preempt = sched._pick_victim, sched._preempt

    def watched_pick():
        if sched.running[-1].awaiting_progress:
            rule_decided[0] += 1
        return pick()

    def watched_preempt(request):
        if request.awaiting_progress:
            preempted_awaiting_progress.append(request.request_id)
        preempt(request)

    sched._pick_victim, sched._preempt = watched_pick, watched_preempt
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        prompts = [rng.integers(3, VOCAB_SIZE, int(n)).tolist() for n in rng.integers(10, 50, 12)]
        outputs = llm.generate(prompts, greedy, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outputs] == [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]

    assert sched.num_preemptions_total >= 10  # the cache really ran out, again and again
    assert rule_decided[0] >= 1  # the old victim rule would have re-preempted a request that had not progressed
    assert preempted_awaiting_progress == [] and sched.num_preemptions_without_progress == 0
    assert not engine.has_unfinished_requests()
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks - 1
    assert engine.runner.requests == {}
    print(f"\nanti-thrashing: {sched.num_preemptions_total} preemptions, the rule chose the victim {rule_decided[0]} "
          f"times, 0 preempted again before progress; 36 greedy outputs equal transformers'")

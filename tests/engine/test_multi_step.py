"""Multi-step decoding (vLLM's --num-scheduler-steps): K decode tokens per dispatch give the tokens (and logprobs)
of K = 1, over stops landing mid-chunk, length caps that are no multiple of K, the context's end, prompts arriving
while others decode, preemption under a tiny KV cache, and the requests that fall back to one token a step; every
block comes back. docs/architecture/05-worker.md, "Several decode steps per dispatch"."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.tiny_models import VOCAB_SIZE, make_tiny_checkpoint
from vllm_jax import LLM, SamplingParams
from vllm_jax.config import EngineArgs

# A tiny KV cache (15 usable blocks of 8 tokens, 4 requests of up to 64 tokens): chunks and preemptions both occur.
# One bucket (docs/contributing/testing.md, "Compile time"): one forward, one chunk program and one sampler set
# per engine.
ARGS = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=16, max_num_seqs=4, max_num_batched_tokens=32,
            min_token_bucket=32, min_seq_bucket=4)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama_multistep")
    make_tiny_checkpoint("llama", path, seed=5)
    return str(path)


@pytest.fixture(scope="module")
def engines(checkpoint):
    """K -> an engine whose dispatches record each step's (num_steps, whether a constrained request is in it)."""
    out = {}
    for k in (1, 4, 8, "4-sync"):  # async scheduling on (the default), and off for K = 4
        steps = 4 if k == "4-sync" else k
        llm = LLM(checkpoint, num_scheduler_steps=steps, async_scheduling=k != "4-sync", **ARGS)
        runner = llm.llm_engine.runner
        runner.steps_seen = []
        dispatch = runner.dispatch

        def recording(sched, runner=runner, dispatch=dispatch):
            constrained = any(r.grammar is not None for r in sched.scheduled_requests.values())
            runner.steps_seen.append((sched.num_steps, constrained))
            return dispatch(sched)

        runner.dispatch = recording
        out[k] = llm
    return out


def _workload(probe: LLM) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, VOCAB_SIZE, int(n)).tolist() for n in (5, 17, 9, 30, 51, 12, 3, 22)]
    first = probe.generate(prompts[2], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0]
    stop_token = first.token_ids[5]  # lands inside a chunk for K = 4 and 8
    params = [
        SamplingParams(temperature=0.0, max_tokens=37, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=3, max_tokens=10, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=1, max_tokens=7, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True, logprobs=0),  # to the context's end
        SamplingParams(temperature=0.0, max_tokens=9, stop=["zz"], ignore_eos=True),  # a stop string: K = 1
        SamplingParams(temperature=0.8, seed=5, n=2, max_tokens=11, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=35),
    ]
    return prompts, params


def _summary(outputs) -> tuple[list, list[float]]:
    values: list[float] = []

    def logprobs(lps):
        if lps is None:
            return None
        values.extend(lp.logprob for e in lps for lp in e.values())
        return [sorted(e) for e in lps]

    # The text too, unless it holds invalid bytes (U+FFFD: the random model's byte tokens), whose decoded text
    # depends on how the tokens were grouped into deliveries (engine/detokenizer.py says why).
    return [[(c.token_ids, c.text if "\ufffd" not in c.text else None, c.finish_reason, c.stop_reason,
              logprobs(c.logprobs)) for c in o.outputs] for o in outputs], values


def _assert_drained(llm: LLM) -> None:
    engine = llm.llm_engine
    assert not engine.has_work()
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks - 1  # no block leaked
    assert engine.runner.requests == {} and engine.runner.input_batch.slot_of == {}


def test_chunks_give_the_tokens_and_logprobs_of_one_step_at_a_time(engines):
    prompts, params = _workload(engines[1])
    want_tokens, want_values = _summary(engines[1].generate(prompts, params, use_tqdm=False))
    reasons = {c[2] for out in want_tokens for c in out}
    assert {"stop", "length"} <= reasons
    for k in (4, 8, "4-sync"):
        llm = engines[k]
        seen = llm.llm_engine.runner.steps_seen
        seen.clear()
        preempted = llm.llm_engine.scheduler.num_preemptions_total
        compiled = llm.llm_engine.runner.num_compilations
        got_tokens, got_values = _summary(llm.generate(prompts, params, use_tqdm=False))
        assert got_tokens == want_tokens
        np.testing.assert_allclose(got_values, want_values, atol=1e-5)
        # chunks ran, and one-token steps for prompts and the stop string
        assert {n for n, _ in seen} == {1, 4 if k == "4-sync" else k}
        assert llm.llm_engine.scheduler.num_preemptions_total > preempted  # the tiny cache preempted (between chunks)
        assert llm.llm_engine.runner.num_compilations == compiled  # warm-up made every program ready
        _assert_drained(llm)
    _assert_drained(engines[1])


def test_a_constrained_request_runs_one_token_a_step_with_the_same_tokens(engines):
    from vllm_jax.sampling_params import StructuredOutputsParams

    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=2, max_tokens=20,
                             structured_outputs=StructuredOutputsParams(regex="[a-c]{2,6}-[0-9]{1,3}"))]
    prompts = [[5, 6, 7], [9, 10, 11, 12]]
    want = [o.outputs[0].token_ids for o in engines[1].generate(prompts, params, use_tqdm=False)]
    runner = engines[4].llm_engine.runner
    runner.steps_seen.clear()
    got = [o.outputs[0].token_ids for o in engines[4].generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert (1, True) in runner.steps_seen and (4, True) not in runner.steps_seen  # no chunk holds the grammar's
    _assert_drained(engines[4])


def test_streaming_delivers_each_chunk_as_it_comes(engines):
    engine = engines[4].llm_engine
    engine.add_request("s", [5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    lengths = []
    while engine.has_work():
        for out in engine.step():
            lengths.append(len(out.outputs[0].token_ids))
    deltas = np.diff([0, *lengths]).tolist()
    assert sum(deltas) == 10 and max(deltas) == 4 and deltas[0] == 1  # the prompt's step, then chunks of 4
    _assert_drained(engines[4])


@pytest.mark.parametrize("extra, message", [
    ({"num_scheduler_steps": 3}, "num_scheduler_steps must be one of"),
    ({"num_scheduler_steps": 4, "speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                                                       "prompt_lookup_max": 2}}, "speculative_config"),
    ({"num_scheduler_steps": 4, "enable_lora": True}, "enable_lora"),
])
def test_unsupported_settings_are_refused_by_name(checkpoint, extra, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(model=checkpoint, **{**ARGS, **extra}).create_config()


def _scheduler(num_blocks: int):
    from vllm_jax.config import SchedulerConfig
    from vllm_jax.paged_kv.kv_cache_manager import KVCacheManager
    from vllm_jax.scheduler.scheduler import Scheduler

    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64, enable_chunked_prefill=True,
                             policy="fcfs", min_token_bucket=4, min_seq_bucket=4, num_scheduler_steps=4)
    return Scheduler(config, KVCacheManager(num_blocks, 4, True, 64), 4)


def _decoding(scheduler, req_id: str, prompt_len: int, **params):
    """A request admitted, its prompt run, its first token sampled: it decodes from now on."""
    from vllm_jax.scheduler.output import ModelRunnerOutput
    from vllm_jax.scheduler.request import Request

    params = SamplingParams(**{"max_tokens": 10, "ignore_eos": True, **params})
    prompt = [100 * ord(req_id) + i for i in range(prompt_len)]  # no prefix shared with another request
    request = Request(request_id=req_id, prompt_token_ids=prompt, sampling_params=params, eos_token_id=2,
                      arrival_time=0.0, seed=0)
    scheduler.add_request(request)
    out = scheduler.schedule()
    assert out.num_steps == 1  # a prompt never runs in a chunk
    ids = list(out.num_scheduled_tokens)  # a request decoding already samples too
    scheduler.update_from_output(out, ModelRunnerOutput(req_ids=ids, sampled_token_ids=[[7]] * len(ids)))
    return request


def test_a_chunk_takes_its_slots_up_front_and_never_preempts_for_them():
    from vllm_jax.scheduler.output import ModelRunnerOutput

    scheduler = _scheduler(num_blocks=8)  # 7 usable blocks of 4 tokens
    request = _decoding(scheduler, "a", prompt_len=7, max_tokens=6)  # 8 tokens known, 7 computed
    out = scheduler.schedule()
    assert (out.num_steps, out.step_limits) == (4, {"a": 4})  # min(K, 5 more tokens)
    assert request.num_computed_tokens == 11 and len(scheduler.kv_cache_manager.get_block_ids("a")) == 3
    scheduler.update_from_output(out, ModelRunnerOutput(req_ids=["a"], sampled_token_ids=[[8, 9, 10, 11]]))
    out = scheduler.schedule()
    assert out.num_steps == 1  # one token left: a one-token step
    scheduler.update_from_output(out, ModelRunnerOutput(req_ids=["a"], sampled_token_ids=[[12]]))
    assert request.is_finished and scheduler.kv_cache_manager.num_free_blocks == 7
    # Too few free blocks for the chunk's slots: a one-token step, nobody preempted.
    scheduler = _scheduler(num_blocks=6)  # 5 usable blocks
    _decoding(scheduler, "b", prompt_len=7, max_tokens=9)
    _decoding(scheduler, "c", prompt_len=7, max_tokens=5)  # b: 9 tokens (3 blocks), c: 8 (2 blocks)
    out = scheduler.schedule()
    assert scheduler.kv_cache_manager.num_free_blocks == 0
    assert out.num_steps == 1 and not out.preempted_req_ids and sum(out.num_scheduled_tokens.values()) == 2
    # A stop string, or more stop ids than the device checks, makes its request (and its steps) one token a time.
    for params in ({"stop": ["x"]}, {"stop_token_ids": list(range(100, 109))}):
        scheduler = _scheduler(num_blocks=16)
        _decoding(scheduler, "c", prompt_len=5, **params)
        assert scheduler.schedule().num_steps == 1
    scheduler = _scheduler(num_blocks=16)
    _decoding(scheduler, "c", prompt_len=5, stop_token_ids=list(range(100, 108)))
    assert scheduler.schedule().num_steps == 4


def test_a_vision_language_model_is_refused_by_name(tmp_path):
    from tests.helpers.vl_models import make_vl_checkpoint

    make_vl_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="vision-language model"):
        EngineArgs(model=str(tmp_path), **{**ARGS, "num_scheduler_steps": 4}).create_config()

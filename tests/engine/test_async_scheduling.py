"""Async scheduling (vLLM's --async-scheduling): step n + 1 is scheduled and dispatched before step n's result is
read, its decode tokens come from the device, and nothing it computes past a stop is ever emitted. Outputs are
identical with it on and off, over chunking, prefix caching and preemption, with the same programs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.tiny_models import VOCAB_SIZE, make_tiny_checkpoint
from vllm_jax import LLM, SamplingParams

# One bucket (docs/contributing/testing.md, "Compile time"): one forward and one sampler set to compile.
ARGS = dict(max_model_len=128, block_size=8, num_gpu_blocks_override=160, max_num_seqs=8,
            max_num_batched_tokens=32, min_token_bucket=32, min_seq_bucket=8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama_async")
    make_tiny_checkpoint("llama", path, seed=5)
    return str(path)


@pytest.fixture(scope="module")
def engines(checkpoint):
    return {mode: LLM(checkpoint, async_scheduling=mode == "async", **ARGS) for mode in ("sync", "async")}


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB_SIZE, int(k)).tolist() for k in rng.integers(2, 60, n)]


def _workload(sync: LLM) -> tuple[list[list[int]], list[SamplingParams]]:
    """Every kind of request the step handles, with stops that land mid-generation: the stop token and the stop
    string are read off a first sync run, so they occur."""
    prompts = _prompts(12)
    probe = sync.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                          use_tqdm=False)
    stop_token = probe[0].outputs[0].token_ids[4]
    stop_text = probe[1].outputs[0].text[5:7]
    assert stop_text, "the probe's text is too short for a stop string"
    params = [
        SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0.0, max_tokens=16, stop=[stop_text]),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=14, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=20, seed=8, n=2, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=10, repetition_penalty=1.3, ignore_eos=True),  # host tokens
        SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=6, prompt_logprobs=1, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=9, max_tokens=20, min_tokens=5),  # host tokens
        SamplingParams(temperature=0.0, max_tokens=20),
        SamplingParams(temperature=0.0, max_tokens=8, logit_bias={7: 4.0, 9: -100.0}, ignore_eos=True),  # full
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
    ]
    return prompts, params


def _summary(outputs) -> tuple[list, list[float]]:
    """What must be identical (tokens, text, finish and stop reasons, the logprobs' token ids), and every logprob
    value (equal up to float rounding: a prompt chunk may share its step with other rows in one mode only)."""
    values: list[float] = []

    def logprobs(lps):
        if lps is None:
            return None
        values.extend(lp.logprob for e in lps for lp in e.values())
        return [sorted(e) for e in lps]

    exact = [[(c.token_ids, c.text, c.finish_reason, c.stop_reason, logprobs(c.logprobs)) for c in o.outputs]
             + [logprobs([e for e in o.prompt_logprobs or [] if e is not None])] for o in outputs]
    return exact, values


def _assert_same(got, want) -> None:
    assert got[0] == want[0]
    np.testing.assert_allclose(got[1], want[1], atol=1e-4)


def _assert_drained(llm: LLM) -> None:
    engine = llm.llm_engine
    assert not engine.has_work()
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks - 1
    assert engine.runner.requests == {} and engine.runner.input_batch.slot_of == {}


@pytest.mark.parametrize("overrides", [
    pytest.param({}, id="chunked-prefill"),
    pytest.param(dict(num_gpu_blocks_override=20), id="tiny-kv-cache-preempts"),
    pytest.param(dict(enable_prefix_caching=False, max_num_batched_tokens=64, min_token_bucket=64),
                 id="prefix-caching-off"),
])
def test_outputs_are_identical_with_async_scheduling_on_and_off(checkpoint, engines, overrides):
    sync, fast = engines["sync"], engines["async"]
    if overrides:
        sync, fast = (LLM(checkpoint, async_scheduling=mode, **{**ARGS, **overrides}) for mode in (False, True))
    prompts, params = _workload(sync)
    before = {llm: llm.llm_engine.runner.num_compilations for llm in (sync, fast)}
    want = _summary(sync.generate(prompts, params, use_tqdm=False))
    got = _summary(fast.generate(prompts, params, use_tqdm=False))
    _assert_same(got, want)
    # The same programs: only prompt_logprobs' all-rows forward compiles on first use, in both modes.
    new = {llm: llm.llm_engine.runner.num_compilations - n for llm, n in before.items()}
    assert new[fast] == new[sync]
    reasons = {c[2] for out in want[0] for c in out[:-1]}
    assert {"stop", "length"} <= reasons  # the stops did land mid-generation
    if "num_gpu_blocks_override" in overrides:
        assert fast.llm_engine.scheduler.num_preemptions_total > 0
    _assert_drained(sync)
    _assert_drained(fast)


def test_prefix_cache_hits_keep_async_outputs(engines):
    rng = np.random.default_rng(4)
    shared = rng.integers(3, VOCAB_SIZE, 40).tolist()
    family = [shared + rng.integers(3, VOCAB_SIZE, 3).tolist() for _ in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    hits = engines["async"].llm_engine.kv_cache_manager.prefix_cache_hits
    got = [o.outputs[0].token_ids for o in engines["async"].generate(family, params, use_tqdm=False)]
    assert engines["async"].llm_engine.kv_cache_manager.prefix_cache_hits > hits
    assert got == [o.outputs[0].token_ids for o in engines["sync"].generate(family, params, use_tqdm=False)]
    _assert_drained(engines["async"])


def _trace_runner(engine) -> list[str]:
    """Record the order of the runner's dispatch / finish calls (d / f) on `engine`."""
    calls: list[str] = []
    runner = engine.runner
    dispatch, finish = runner.dispatch, runner.finish

    def traced_dispatch(sched):
        flight = dispatch(sched)
        if flight is not None:
            calls.append("d")
        return flight

    def traced_finish(flight):
        if flight is not None:
            calls.append("f")
        return finish(flight)

    runner.dispatch, runner.finish = traced_dispatch, traced_finish
    return calls


def test_the_next_step_is_dispatched_before_the_current_one_is_read(checkpoint):
    llm = LLM(checkpoint, async_scheduling=True, **ARGS)
    engine = llm.llm_engine
    calls = _trace_runner(engine)
    compilations = engine.runner.num_compilations
    llm.generate(_prompts(4), SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert engine.runner.num_compilations == compilations
    # Every step but the first is dispatched while the one before it is still unread.
    assert "".join(calls).startswith("dd" + "fd" * 3)
    assert calls.count("d") == calls.count("f")
    # A request whose next inputs need its newest token on the host runs the plain way: dispatch, finish.
    calls.clear()
    prompt = _prompts(1)[0]
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6, presence_penalty=0.5, ignore_eos=True),
                 use_tqdm=False)
    prefill_steps = -(-len(prompt) // ARGS["max_num_batched_tokens"])
    assert "".join(calls) == "df" * (prefill_steps + 5)
    _assert_drained(llm)


def test_a_token_sampled_past_a_stop_is_dropped_and_its_request_freed(engines):
    engine = engines["async"].llm_engine
    prompt = _prompts(1, seed=3)[0]
    first = engines["sync"].generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                                     use_tqdm=False)[0].outputs[0].token_ids
    params = SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[first[2]])
    engine.add_request("stops", prompt, params)
    outputs = []
    while engine.has_work():
        outputs += engine.step()
    final = [o for o in outputs if o.finished]
    assert len(final) == 1 and final[0].outputs[0].token_ids == first[:first.index(first[2]) + 1]
    assert final[0].outputs[0].finish_reason == "stop"
    _assert_drained(engines["async"])


def test_abort_with_a_step_in_flight_frees_everything(engines):
    engine = engines["async"].llm_engine
    engine.add_request("victim", _prompts(1, seed=6)[0], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("other", _prompts(1, seed=7)[0], SamplingParams(max_tokens=5, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert engine._in_flight is not None  # the next step is on the device
    engine.abort_request("victim")
    finals = []
    while engine.has_work():
        finals += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in finals] == ["other"] and len(finals[0].outputs[0].token_ids) == 5
    _assert_drained(engines["async"])


def test_an_id_reused_while_its_last_step_is_in_flight_gets_only_its_own_tokens(engines):
    """A request stopped by a stop token is still in the step dispatched after it; a new request given the same
    id before that step is read must not receive that step's token."""
    engine = engines["async"].llm_engine
    first, second = _prompts(2, seed=12)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in engines["sync"].generate([first, second], greedy, use_tqdm=False)]
    engine.add_request("same", first, SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[want[0][2]]))
    finished = []
    while not finished:
        finished = [o for o in engine.step() if o.finished]
    assert engine._in_flight is not None  # the step after the stop was dispatched
    engine.add_request("same", second, greedy)
    outputs = []
    while engine.has_work():
        outputs += [o for o in engine.step() if o.finished]
    assert [o.outputs[0].token_ids for o in outputs] == [want[1]]
    _assert_drained(engines["async"])


def test_structured_outputs_mixed_with_free_requests_are_identical_on_and_off(tmp_path_factory):
    """Constrained rows make their steps synchronous while they run; free rows before and after run ahead. Both
    modes give the same tokens, every constrained one valid."""
    import re

    from tests.helpers.live_server import tiny_checkpoint
    from vllm_jax.sampling_params import StructuredOutputsParams

    path = str(tiny_checkpoint(tmp_path_factory.mktemp("async_so")))
    pattern = "[a-c]{2,6}-[0-9]{1,3}"
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * 3 + [
        SamplingParams(temperature=1.0, seed=s, max_tokens=30,
                       structured_outputs=StructuredOutputsParams(regex=pattern)) for s in range(3)]
    prompts = ["hello", "a b c", "zz"] * 2
    outputs = {}
    for mode in (False, True):
        llm = LLM(path, async_scheduling=mode, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=32,
                  block_size=8, min_token_bucket=32, min_seq_bucket=8)
        outputs[mode] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        _assert_drained(llm)
    assert [c.token_ids for c in outputs[True]] == [c.token_ids for c in outputs[False]]
    assert all(re.fullmatch(pattern, c.text) for c in outputs[True][3:])

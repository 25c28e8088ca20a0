"""End to end through LLM.generate on a tiny random Llama: batching, chunking, prefix caching and preemption
never change greedy outputs, which equal transformers'; seeded sampling ignores its batch; nothing leaks."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.helpers.tiny_models import VOCAB_SIZE, hf_greedy, make_tiny_checkpoint
from vllm_jax import LLM, SamplingParams

MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
BASE_ARGS = dict(max_model_len=128, block_size=8, num_gpu_blocks_override=160, max_num_seqs=32,
                 max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    return path, make_tiny_checkpoint("llama", path, seed=7)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(11)
    return [rng.integers(3, VOCAB_SIZE, int(n)).tolist() for n in rng.integers(1, 60, 32)]


@pytest.fixture(scope="module")
def reference(checkpoint, prompts):
    _, hf = checkpoint
    return [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]


@pytest.fixture(scope="module")
def llm(checkpoint):
    with pytest.MonkeyPatch.context() as patch:  # its forwards compile side by side, whatever the CPU count
        patch.setenv("VLLM_JAX_COMPILE_THREADS", "2")
        return LLM(str(checkpoint[0]), **BASE_ARGS)


def _token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def _assert_drained(llm: LLM):
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks - 1
    assert engine.runner.requests == {}


def test_batch_of_32_mixed_lengths_equals_transformers_greedy(llm, prompts, reference):
    assert _token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    _assert_drained(llm)


def test_a_request_alone_equals_the_same_request_in_the_batch(llm, prompts, reference):
    for i in (0, 5, 17):
        assert _token_ids(llm.generate([prompts[i]], GREEDY, use_tqdm=False)) == [reference[i]]
    _assert_drained(llm)


def test_prefix_cache_hits_do_not_change_outputs(llm, checkpoint):
    _, hf = checkpoint
    rng = np.random.default_rng(3)
    shared = rng.integers(3, VOCAB_SIZE, 40).tolist()
    family = [shared + rng.integers(3, VOCAB_SIZE, 5).tolist() for _ in range(6)]
    manager = llm.llm_engine.kv_cache_manager
    hits_before = manager.prefix_cache_hits
    assert _token_ids(llm.generate(family, GREEDY, use_tqdm=False)) == [hf_greedy(hf, p, MAX_TOKENS) for p in family]
    assert manager.prefix_cache_hits > hits_before
    _assert_drained(llm)


@pytest.mark.parametrize("overrides", [
    pytest.param(dict(enable_prefix_caching=False), id="prefix-caching-off"),
    pytest.param(dict(max_num_batched_tokens=16, max_num_seqs=8), id="forced-chunking"),
    pytest.param(dict(num_gpu_blocks_override=24), id="tiny-kv-cache-preempts"),
    pytest.param(dict(scan_layers=False), id="layers-unrolled-not-scanned"),
    pytest.param(dict(async_scheduling=False, num_gpu_blocks_override=24), id="sync-scheduling-preempts"),
])
def test_engine_configurations_keep_greedy_outputs(checkpoint, prompts, reference, overrides):
    args = {**BASE_ARGS, **overrides}
    # One bucket (docs/contributing/testing.md, "Compile time"): bucket coverage is the subject of the shared
    # engine's no-compilation test, not of these.
    llm = LLM(str(checkpoint[0]), min_token_bucket=args["max_num_batched_tokens"], min_seq_bucket=args["max_num_seqs"],
              **args)
    assert _token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == reference
    if "num_gpu_blocks_override" in overrides:
        assert llm.llm_engine.scheduler.num_preemptions_total > 0
    _assert_drained(llm)


def test_seeded_sampling_is_the_same_whatever_the_batch(llm, prompts):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=MAX_TOKENS, ignore_eos=True)
    alone = _token_ids(llm.generate([prompts[2]], params, use_tqdm=False))[0]
    others = SamplingParams(temperature=0.8, max_tokens=MAX_TOKENS, ignore_eos=True)
    batch = llm.generate(prompts[:8], [others] * 2 + [params] + [others] * 5, use_tqdm=False)
    assert batch[2].outputs[0].token_ids == alone
    different_seed = SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=MAX_TOKENS, ignore_eos=True)
    assert _token_ids(llm.generate([prompts[2]], different_seed, use_tqdm=False))[0] != alone
    _assert_drained(llm)


def test_logprobs_equal_transformers_log_softmax(llm, checkpoint, prompts):
    _, hf = checkpoint
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=3, ignore_eos=True)
    out = llm.generate([prompts[1]], params, use_tqdm=False)[0].outputs[0]
    sequence = prompts[1] + out.token_ids
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([sequence])).logits[0], -1).numpy()
    for step, (token, entries) in enumerate(zip(out.token_ids, out.logprobs)):
        row = ref[len(prompts[1]) - 1 + step]
        assert set(entries) == set(np.argsort(-row)[:3].tolist()) | {token}
        for tid, lp in entries.items():
            assert abs(lp.logprob - row[tid]) < 1e-4
        assert entries[token].rank == 1
    assert out.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs)))


def test_abort_frees_blocks_at_once(llm, prompts):
    engine = llm.llm_engine
    engine.add_request("victim", prompts[4], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.kv_cache_manager.num_free_blocks < engine.runner.num_blocks - 1
    engine.abort_request("victim")
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks - 1
    assert not engine.has_unfinished_requests()
    engine.step()  # the runner drops the aborted request's state on the next step
    _assert_drained(llm)


def test_no_compilation_after_warmup_over_a_random_workload_of_100_requests(llm):
    runner = llm.llm_engine.runner
    # every token bucket's forward was made ready two compiles at a time (DeviceStep.precompile_forwards), before
    # the plan's own order reached it
    assert runner.compilation.forwards_side_by_side == len(runner.token_buckets) > 1
    before = runner.num_compilations
    rng = np.random.default_rng(5)
    prompts, params = [], []
    for i in range(100):
        prompts.append(rng.integers(3, VOCAB_SIZE, int(rng.integers(1, 100))).tolist())
        params.append(SamplingParams(
            temperature=float(rng.choice([0.0, 0.7, 1.0])), top_p=float(rng.choice([1.0, 0.8])),
            top_k=int(rng.choice([0, 5])), min_p=float(rng.choice([0.0, 0.05])),
            repetition_penalty=float(rng.choice([1.0, 1.2])), presence_penalty=float(rng.choice([0.0, 0.5])),
            logprobs=[None, 0, 2][i % 3], n=1 + (i % 7 == 0), seed=int(rng.integers(0, 2**31)) if i % 2 else None,
            max_tokens=int(rng.integers(1, 20)), ignore_eos=bool(i % 2)))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert len(outputs) == 100 and all(o.finished for o in outputs)
    assert runner.num_compilations == before
    _assert_drained(llm)


def test_prompt_logprobs_over_chunked_prefill_equal_transformers(llm, checkpoint):
    _, hf = checkpoint
    prompt = np.random.default_rng(8).integers(3, VOCAB_SIZE, 100).tolist()  # > 64-token budget: two chunks
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0], -1).numpy()
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for pos in range(1, len(prompt)):
        entries, row = out.prompt_logprobs[pos], ref[pos - 1]
        assert prompt[pos] in entries
        assert set(entries) == set(np.argsort(-row)[:2].tolist()) | {prompt[pos]}
        for tid, lp in entries.items():
            assert abs(lp.logprob - row[tid]) < 1e-4
    _assert_drained(llm)


def test_compile_threads_come_from_the_environment_and_a_bad_value_is_named(monkeypatch):
    from vllm_jax.worker.compilation import compile_threads

    monkeypatch.delenv("VLLM_JAX_COMPILE_THREADS", raising=False)
    assert compile_threads() == max(1, os.cpu_count() or 1)
    monkeypatch.setenv("VLLM_JAX_COMPILE_THREADS", "3")
    assert compile_threads() == 3
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv("VLLM_JAX_COMPILE_THREADS", bad)
        with pytest.raises(ValueError, match=f"VLLM_JAX_COMPILE_THREADS must be a positive integer; got '{bad}'"):
            compile_threads()

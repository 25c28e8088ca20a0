"""Scheduler: token budget, max_num_seqs, chunked prefill, preemption, stop checks, aborts, draining."""

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_jax.config import SchedulerConfig
from vllm_jax.paged_kv.kv_cache_manager import KVCacheManager
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.scheduler.output import ModelRunnerOutput
from vllm_jax.scheduler.request import Request, RequestStatus
from vllm_jax.scheduler.scheduler import Scheduler

BS = 4
EOS = 2


def make_scheduler(num_blocks=64, max_num_seqs=8, budget=32, max_model_len=64, chunking=True, policy="fcfs",
                   caching=True):
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
                             enable_chunked_prefill=chunking, policy=policy, min_token_bucket=16, min_seq_bucket=8)
    kv = KVCacheManager(num_blocks=num_blocks, block_size=BS, enable_caching=caching, max_model_len=max_model_len)
    return Scheduler(config, kv, BS)


_arrival = iter(range(1_000_000))


def make_request(req_id, prompt_len=None, prompt=None, priority=0, **params):
    """A request whose default prompt is unique (no accidental prefix hits): [base, base+1, ...]."""
    params.setdefault("max_tokens", 4)
    arrival = next(_arrival)
    prompt = list(prompt) if prompt is not None else [1000 * (arrival + 1) + i for i in range(prompt_len)]
    return Request(request_id=req_id, prompt_token_ids=prompt, sampling_params=SamplingParams(**params),
                   eos_token_id=EOS, arrival_time=float(arrival), seed=0, priority=priority)


class FakeRunner:
    """Stands in for the model runner: mirrors its per-request block tables from the scheduler's messages
    and samples `token_fn(request)` for every request whose known tokens are all computed after the step."""

    def __init__(self, scheduler, token_fn=lambda req: 7, prompt_logprobs=False):
        self.scheduler = scheduler
        self.token_fn = token_fn
        self.prompt_logprobs = prompt_logprobs
        self.block_tables: dict[str, list[int]] = {}

    def execute(self, out):
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            self.block_tables.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            assert new.req_id not in self.block_tables
            self.block_tables[new.req_id] = list(new.block_ids)
        cached = out.scheduled_cached_reqs
        for req_id, new_block_ids in zip(cached.req_ids, cached.new_block_ids):
            self.block_tables[req_id] += new_block_ids
        ids, sampled, logprobs = list(out.num_scheduled_tokens), [], []
        kv = self.scheduler.kv_cache_manager
        for req_id in ids:
            req = self.scheduler.requests[req_id]
            assert self.block_tables[req_id] == kv.get_block_ids(req_id)
            assert len(self.block_tables[req_id]) * BS >= req.num_computed_tokens  # already advanced
            done = req.num_computed_tokens >= req.num_tokens
            sampled.append([self.token_fn(req)] if done else [])
            logprobs.append([([sampled[-1][0]], [-0.5], [1])] if done else None)
        prompt_lp = {r: [([1], [-1.0], [1])] for r in ids} if self.prompt_logprobs else {}
        return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, logprobs=logprobs,
                                 prompt_logprobs=prompt_lp)


def step(sched, runner):
    out = sched.schedule()
    return out, sched.update_from_output(out, runner.execute(out))


def drain(sched, runner, max_steps=500):
    outputs = []
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            return outputs
        outputs += step(sched, runner)[1]
    raise AssertionError("scheduler did not drain")


# ---- budget, max_num_seqs, chunking -----------------------------------------------------------------


def test_token_budget_is_shared_and_the_prompt_that_overflows_is_chunked():
    sched = make_scheduler(budget=32)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", 12))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"r0": 12, "r1": 12, "r2": 8}
    assert out.total_num_scheduled_tokens == 32


def test_max_num_seqs_caps_running_requests():
    sched = make_scheduler(max_num_seqs=2)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", 4, max_tokens=2))
    runner = FakeRunner(sched)
    out, _ = step(sched, runner)
    assert list(out.num_scheduled_tokens) == ["r0", "r1"] and sched.num_waiting == 1
    out, finished = step(sched, runner)
    assert {o.req_id for o in finished if o.finish_reason} == {"r0", "r1"}
    out, _ = step(sched, runner)
    assert list(out.num_scheduled_tokens) == ["r2"]


def test_long_prompt_is_chunked_across_steps_and_samples_only_after_the_last_chunk():
    sched = make_scheduler(budget=16)
    sched.add_request(make_request("long", 40))
    runner = FakeRunner(sched)
    seen = []
    for _ in range(3):
        out, outputs = step(sched, runner)
        computed = [r.num_computed_tokens for r in out.scheduled_new_reqs]
        computed += out.scheduled_cached_reqs.num_computed_tokens
        seen.append((out.num_scheduled_tokens["long"], computed[0], len(outputs)))
    assert seen == [(16, 0, 0), (16, 16, 0), (8, 32, 1)]
    assert out.scheduled_new_reqs == [] and out.scheduled_cached_reqs.req_ids == ["long"]


def test_without_chunked_prefill_a_prompt_that_does_not_fit_waits_whole():
    sched = make_scheduler(budget=16, chunking=False)
    sched.add_request(make_request("a", 10))
    sched.add_request(make_request("b", 10))
    runner = FakeRunner(sched)
    out, _ = step(sched, runner)
    assert out.num_scheduled_tokens == {"a": 10}
    out, _ = step(sched, runner)
    assert out.num_scheduled_tokens == {"a": 1, "b": 10}


def test_running_requests_come_before_new_ones_in_batch_order():
    sched = make_scheduler()
    sched.add_request(make_request("old", 5))
    runner = FakeRunner(sched)
    step(sched, runner)
    sched.add_request(make_request("new", 5))
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == ["old", "new"]
    assert out.scheduled_cached_reqs.req_ids == ["old"]
    assert [r.req_id for r in out.scheduled_new_reqs] == ["new"]


# ---- preemption ----------------------------------------------------------------------------------------


def test_fcfs_preempts_the_last_running_request_and_admits_nobody_that_step():
    sched = make_scheduler(num_blocks=5, budget=32)  # 4 usable blocks
    sched.add_request(make_request("a", 8, max_tokens=8))
    sched.add_request(make_request("b", 8, max_tokens=8))
    runner = FakeRunner(sched)
    step(sched, runner)  # both prefilled: 4 blocks in use, one output token each
    sched.add_request(make_request("c", 2, max_tokens=1))  # would fit once b's blocks are freed
    out, _ = step(sched, runner)
    assert out.preempted_req_ids == {"b"}
    assert out.num_scheduled_tokens == {"a": 1}
    b = sched.requests["b"]
    assert b.status == RequestStatus.PREEMPTED and b.num_preemptions == 1 and b.num_computed_tokens == 0
    assert [r.request_id for r in sched.waiting] == ["b", "c"]
    assert sched.num_preemptions_total == 1
    outputs = drain(sched, runner)
    assert {o.req_id for o in outputs if o.finish_reason == "length"} == {"a", "b", "c"}


def test_resumed_request_is_sent_as_new_with_all_its_tokens():
    sched = make_scheduler(num_blocks=5, budget=32, caching=False)
    sched.add_request(make_request("a", 8, max_tokens=8))
    b = make_request("b", 8, max_tokens=8)
    prompt = list(b.prompt_token_ids)
    sched.add_request(b)
    runner = FakeRunner(sched)
    step(sched, runner)
    step(sched, runner)  # b preempted here
    for _ in range(20):
        out = sched.schedule()
        new = [r for r in out.scheduled_new_reqs if r.req_id == "b"]
        sched.update_from_output(out, runner.execute(out))
        if new:
            break
    assert new[0].token_ids == prompt + [7]
    assert new[0].num_computed_tokens == 0 and new[0].num_prompt_tokens == 8


@pytest.mark.parametrize("policy, victim", [("fcfs", "a"), ("priority", "b")])
def test_preemption_victim_is_last_running_for_fcfs_and_lowest_priority_for_priority(policy, victim):
    sched = make_scheduler(num_blocks=6, budget=32, policy=policy)  # 5 usable blocks
    runner = FakeRunner(sched)
    sched.add_request(make_request("b", 7, priority=5, max_tokens=10))
    step(sched, runner)
    sched.add_request(make_request("a", 7, priority=0, max_tokens=10))
    step(sched, runner)  # b: 3 blocks, a: 2 blocks, none free
    step(sched, runner)  # both decode inside their last block
    out, _ = step(sched, runner)  # a needs a third block
    assert out.preempted_req_ids == {victim}
    survivor = "b" if victim == "a" else "a"
    assert out.num_scheduled_tokens == {survivor: 1}  # the victim's tokens were taken back
    assert out.scheduled_cached_reqs.req_ids == [survivor]
    drain(sched, runner)
    assert sched.kv_cache_manager.num_free_blocks == 5


def test_no_waiting_request_is_admitted_in_a_step_that_preempted():
    # Priority policy, so the waiting newcomer (not the victim) is first in line once blocks are freed.
    sched = make_scheduler(num_blocks=5, budget=32, policy="priority")  # 4 usable blocks
    sched.add_request(make_request("a", 8, priority=0, max_tokens=8))
    sched.add_request(make_request("b", 8, priority=1, max_tokens=8))
    runner = FakeRunner(sched)
    step(sched, runner)
    sched.add_request(make_request("c", 2, priority=0, max_tokens=1))  # fits in the block b leaves free
    out, _ = step(sched, runner)
    assert out.preempted_req_ids == {"b"} and out.num_scheduled_tokens == {"a": 1}
    assert sched.kv_cache_manager.num_free_blocks == 1
    out, _ = step(sched, runner)
    assert "c" in out.num_scheduled_tokens  # admitted in the next step


def test_priority_preemption_of_an_already_scheduled_request_returns_its_budget():
    sched = make_scheduler(num_blocks=7, budget=32, policy="priority")  # 6 usable blocks
    runner = FakeRunner(sched)
    sched.add_request(make_request("b", 7, priority=5, max_tokens=10))
    step(sched, runner)
    sched.add_request(make_request("a", 7, priority=0, max_tokens=10))
    sched.add_request(make_request("d", 3, priority=1, max_tokens=10))
    step(sched, runner)  # running [b, a, d] holding 3 + 2 + 1 blocks
    step(sched, runner)
    sched.config = dataclasses.replace(sched.config, max_num_batched_tokens=2)
    out, _ = step(sched, runner)  # b scheduled, then a needs a block: b is preempted and its token given back
    assert out.preempted_req_ids == {"b"}
    assert out.num_scheduled_tokens == {"a": 1, "d": 1}


def test_one_allocation_preempts_victims_in_policy_order_until_it_fits_and_takes_back_their_tokens():
    sched = make_scheduler(num_blocks=6, budget=10, policy="priority")  # 5 usable blocks
    events = _watch_preemptions(sched)
    runner = FakeRunner(sched)
    sched.add_request(make_request("b", 4, priority=5, max_tokens=10))
    sched.add_request(make_request("c", 2, priority=6, max_tokens=10))
    step(sched, runner)  # b: 1 block, c: 1 block
    sched.add_request(make_request("a", 16, priority=0, max_tokens=4))
    out, _ = step(sched, runner)  # b: 2 blocks, c: 1, a's first 8 prompt tokens: 2; none free
    assert out.num_scheduled_tokens == {"b": 1, "c": 1, "a": 8} and sched.kv_cache_manager.num_free_blocks == 0
    out, _ = step(sched, runner)  # b and c scheduled, then a's next chunk needs 2 blocks: c frees 1, b frees 2
    assert [request_id for request_id, _ in events] == ["c", "b"]
    assert out.preempted_req_ids == {"b", "c"}
    assert out.num_scheduled_tokens == {"a": 8} and out.total_num_scheduled_tokens == 8
    assert out.scheduled_cached_reqs.req_ids == ["a"] and out.scheduled_new_reqs == []
    assert [r.request_id for r in sched.waiting] == ["b", "c"] and sched.kv_cache_manager.num_free_blocks == 1
    outputs = drain(sched, runner)
    assert {o.req_id for o in outputs if o.finish_reason == "length"} == {"a", "b", "c"}
    assert sched.kv_cache_manager.num_free_blocks == 5


def test_without_chunking_a_resumed_request_longer_than_the_budget_is_chunked_rather_than_starved():
    sched = make_scheduler(num_blocks=8, budget=16, chunking=False, policy="priority", caching=False)
    runner = FakeRunner(sched)
    sched.add_request(make_request("a", 16, priority=5, max_tokens=4))
    step(sched, runner)
    sched.add_request(make_request("b", 8, priority=0, max_tokens=20))
    step(sched, runner)
    out, _ = step(sched, runner)
    assert out.preempted_req_ids == {"a"} and sched.requests["a"].num_tokens > 16
    outputs = drain(sched, runner)
    assert {o.req_id for o in outputs if o.finish_reason} == {"a", "b"}


# ---- stop checks ---------------------------------------------------------------------------------------


def _run_one(sched_kwargs=None, token_seq=(7,), **params):
    sched = make_scheduler(**(sched_kwargs or {}))
    sched.add_request(make_request("r", 4, **params))
    tokens = iter(token_seq)
    last = [token_seq[-1]]

    def token_fn(req):
        last[0] = next(tokens, last[0])
        return last[0]

    outputs = drain(sched, FakeRunner(sched, token_fn))
    produced = [t for o in outputs for t in o.new_token_ids]
    return produced, outputs[-1]


def test_eos_stops_with_reason_stop_and_no_stop_reason():
    produced, final = _run_one(token_seq=(5, EOS), max_tokens=10)
    assert produced == [5, EOS] and final.finish_reason == "stop" and final.stop_reason is None


def test_ignore_eos_runs_to_max_tokens():
    produced, final = _run_one(token_seq=(EOS,), max_tokens=3, ignore_eos=True)
    assert produced == [EOS] * 3 and final.finish_reason == "length"


def test_stop_token_id_stops_and_is_reported_as_stop_reason():
    produced, final = _run_one(token_seq=(5, 9), max_tokens=10, stop_token_ids=[9])
    assert produced == [5, 9] and final.finish_reason == "stop" and final.stop_reason == 9


def test_min_tokens_suppresses_eos_and_stop_ids_until_reached():
    produced, final = _run_one(token_seq=(EOS, 9, EOS), max_tokens=10, min_tokens=3, stop_token_ids=[9])
    assert produced == [EOS, 9, EOS] and final.finish_reason == "stop"


def test_max_tokens_none_runs_until_max_model_len():
    produced, final = _run_one({"max_model_len": 12}, max_tokens=None)
    assert len(produced) == 8 and final.finish_reason == "length"


def test_outputs_carry_logprobs_and_partial_prefill_reports_only_prompt_logprobs():
    sched = make_scheduler(budget=16)
    sched.add_request(make_request("r", 20, max_tokens=1, prompt_logprobs=1))
    runner = FakeRunner(sched, prompt_logprobs=True)
    _, first = step(sched, runner)
    assert len(first) == 1 and first[0].new_token_ids == [] and first[0].new_prompt_logprobs
    _, second = step(sched, runner)
    assert second[0].new_token_ids == [7] and second[0].new_logprobs == [([7], [-0.5], [1])]
    sched.add_request(make_request("q", 20, max_tokens=1))
    _, no_lp = step(sched, FakeRunner(sched))
    assert no_lp == []  # partial prefill without prompt logprobs: nothing to report


def test_a_prefill_recomputed_after_a_preemption_reports_each_prompt_position_once():
    """b is preempted after scoring prompt positions 1-2; its recompute scores them again, and only positions
    3-11 may be reported (an output processor appends what it gets, so a repeat would shift every score)."""

    class PositionRunner(FakeRunner):
        """Scores each prompt position p with logprob -p (logits at p - 1 score the token at p)."""

        def execute(self, out):
            result = super().execute(out)
            result.prompt_logprobs = {}
            for req_id, n in out.num_scheduled_tokens.items():
                req = self.scheduler.requests[req_id]
                start = req.num_computed_tokens - n
                positions = range(start + 1, min(start + n, req.num_prompt_tokens - 1) + 1)
                if req.sampling_params.prompt_logprobs is not None and positions:
                    result.prompt_logprobs[req_id] = [([req.prompt_token_ids[p]], [-p], [1]) for p in positions]
            return result

    sched = make_scheduler(num_blocks=6, budget=10, caching=False)  # 5 usable blocks of 4 tokens
    sched.add_request(make_request("a", 8, max_tokens=12))
    sched.add_request(make_request("b", 12, max_tokens=1, prompt_logprobs=0))
    outputs = drain(sched, PositionRunner(sched))
    assert sched.requests == {} and sched.num_preemptions_total >= 1
    reported = [lp for o in outputs if o.req_id == "b" for _, lps, _ in o.new_prompt_logprobs or [] for lp in lps]
    assert reported == [-p for p in range(1, 12)]


# ---- aborts, finishing, prefix cache --------------------------------------------------------------------


def test_abort_frees_blocks_at_once_and_reports_the_id_next_step():
    sched = make_scheduler(num_blocks=16)
    sched.add_request(make_request("a", 9))
    sched.add_request(make_request("w", 4))
    runner = FakeRunner(sched)
    step(sched, runner)
    assert sched.kv_cache_manager.num_free_blocks < 15
    sched.abort("a")
    sched.abort("w")
    sched.abort("unknown")
    sched.abort("a")  # already finished: ignored
    assert sched.kv_cache_manager.num_free_blocks == 15 and not sched.has_unfinished_requests()
    out = sched.schedule()
    assert out.finished_req_ids == {"a", "w"} and out.num_scheduled_tokens == {}
    assert sched.schedule().finished_req_ids == set()


def test_abort_of_a_waiting_request_removes_it_from_the_queue():
    sched = make_scheduler(max_num_seqs=1)
    sched.add_request(make_request("a", 4))
    sched.add_request(make_request("b", 4))
    sched.schedule()
    sched.abort("b")
    assert sched.num_waiting == 0 and sched.get_num_unfinished_requests() == 1


def test_finish_requests_for_a_stop_string_marks_stopped():
    sched = make_scheduler()
    req = make_request("a", 4)
    sched.add_request(req)
    sched.schedule()
    assert sched.finish_requests(["a", "zzz"], RequestStatus.FINISHED_STOPPED) == ["a"]
    assert req.status.finish_reason == "stop" and sched.kv_cache_manager.num_free_blocks == 63


def test_prefix_hit_is_reported_and_only_the_rest_is_scheduled():
    sched = make_scheduler()
    runner = FakeRunner(sched)
    sched.add_request(make_request("a", prompt=range(10), max_tokens=1))
    drain(sched, runner)
    sched.add_request(make_request("b", prompt=range(10), max_tokens=1))
    out, outputs = step(sched, runner)
    assert out.num_scheduled_tokens == {"b": 2}
    assert out.scheduled_new_reqs[0].num_computed_tokens == 8
    assert outputs[0].num_cached_tokens == 8
    assert sched.kv_cache_manager.prefix_cache_hits == 8


# ---- bad requests --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, req, message", [
    ({}, make_request("x", prompt=[]), "empty"),
    ({"max_model_len": 20}, make_request("x", 15, max_tokens=10), r"you requested 25 tokens \(15 in the input, 10"),
    ({"max_model_len": 20}, make_request("x", 20, max_tokens=None), "maximum context length is 20 tokens. However, "
     "your request has 20 input tokens"),
    ({"num_blocks": 4}, make_request("x", 10, max_tokens=4), "only 3 blocks of 4 tokens"),
    ({"chunking": False, "budget": 16}, make_request("x", 17), "max_num_batched_tokens"),
])
def test_bad_requests_are_rejected_with_the_numbers(kwargs, req, message):
    sched = make_scheduler(**kwargs)
    with pytest.raises(ValueError, match=message):
        sched.add_request(req)
    assert not sched.has_unfinished_requests()


def test_duplicate_request_id_is_rejected():
    sched = make_scheduler()
    sched.add_request(make_request("x", 4))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(make_request("x", 4))


# ---- random workloads drain to an empty cache -----------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_blocks=st.integers(6, 24), budget=st.sampled_from([8, 16, 32]),
       max_num_seqs=st.integers(1, 6), chunking=st.booleans(), policy=st.sampled_from(["fcfs", "priority"]),
       caching=st.booleans())
def test_random_workload_drains_with_every_block_free(seed, num_blocks, budget, max_num_seqs, chunking, policy,
                                                       caching):
    rng = random.Random(seed)
    max_model_len = 32
    sched = make_scheduler(num_blocks=num_blocks, max_num_seqs=max_num_seqs, budget=max(budget, max_num_seqs),
                           max_model_len=max_model_len, chunking=chunking, policy=policy, caching=caching)
    shared_prefix = [rng.randrange(50, 60) for _ in range(8)]
    runner = FakeRunner(sched, token_fn=lambda req: EOS if rng.random() < 0.1 else rng.randrange(3, 40))
    pending = 16
    for _ in range(400):
        if pending and rng.random() < 0.5:
            pending -= 1
            prompt = shared_prefix[:rng.randrange(0, 9)] + [rng.randrange(3, 50) for _ in range(rng.randrange(1, 12))]
            req = make_request(f"r{pending}", prompt=prompt, priority=rng.randrange(3),
                               max_tokens=rng.randrange(1, 12))
            try:
                sched.add_request(req)
            except ValueError:
                pass
        if rng.random() < 0.05 and sched.requests:
            sched.abort(rng.choice(sorted(sched.requests)))
        out, _ = step(sched, runner)
        assert out.total_num_scheduled_tokens <= sched.config.max_num_batched_tokens
        assert sched.num_running <= max_num_seqs
        if not pending and not sched.has_unfinished_requests():
            break
    assert not sched.has_unfinished_requests(), "workload did not drain"
    assert sched.kv_cache_manager.num_free_blocks == num_blocks - 1
    runner.execute(sched.schedule())  # deliver the last finished ids
    assert runner.block_tables == {}


def test_last_token_that_is_eos_at_max_tokens_reports_length_like_vllm():
    produced, final = _run_one(token_seq=(5, EOS), max_tokens=2)
    assert produced == [5, EOS] and final.finish_reason == "length"


# ---- anti-thrashing: a resumed request is not preempted again before it makes progress ---------------------


def _watch_preemptions(sched):
    """Record (request id, awaiting_progress) for every preemption the scheduler makes."""
    events = []
    preempt = sched._preempt

    def watched(request):
        events.append((request.request_id, request.awaiting_progress))
        preempt(request)

    sched._preempt = watched
    return events


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_resumed_request_is_not_preempted_again_before_it_samples(policy):
    # 4 usable blocks, budget 8: b is preempted, resumes with a 7-token recompute chunk (no sample yet), then a
    # needs a block. Without the rule b (last running; lowest priority) would be preempted again for nothing.
    sched = make_scheduler(num_blocks=5, budget=8, caching=False, policy=policy)
    sched.add_request(make_request("a", 4, max_tokens=8, priority=0))
    sched.add_request(make_request("b", 7, max_tokens=8, priority=1))
    runner = FakeRunner(sched)
    for _ in range(3):
        step(sched, runner)
    out, _ = step(sched, runner)
    assert out.preempted_req_ids == {"b"}
    out, _ = step(sched, runner)
    assert out.num_scheduled_tokens == {"a": 1, "b": 7} and sched.requests["b"].awaiting_progress
    out, outputs = step(sched, runner)
    assert out.preempted_req_ids == {"a"}
    assert out.num_scheduled_tokens == {"b": 2}  # the step goes on after a gave way: b finishes its recompute
    assert [o.req_id for o in outputs] == ["b"] and not sched.requests["b"].awaiting_progress
    outputs = drain(sched, runner)
    assert {o.req_id for o in outputs if o.finish_reason == "length"} == {"a", "b"}
    assert sched.num_preemptions_without_progress == 0
    assert sched.kv_cache_manager.num_free_blocks == 4


@pytest.mark.parametrize("policy, victim", [("fcfs", "b"), ("priority", "a")])
def test_when_every_running_request_awaits_progress_the_policy_victim_is_preempted_anyway(policy, victim):
    sched = make_scheduler(num_blocks=5, budget=32, caching=False, policy=policy)  # 4 usable blocks
    sched.add_request(make_request("a", 8, max_tokens=8, priority=1))
    sched.add_request(make_request("b", 8, max_tokens=8, priority=0))
    runner = FakeRunner(sched)
    step(sched, runner)  # both prefilled into 2 blocks each, none free
    for request in sched.running:  # as if both had just been resumed
        request.num_output_tokens_at_resume = request.num_output_tokens
    out, _ = step(sched, runner)  # a needs a third block: no candidate has progressed, so no deadlock either
    assert out.preempted_req_ids == {victim}
    assert sched.num_preemptions_without_progress == 1
    outputs = drain(sched, runner)
    assert {o.req_id for o in outputs if o.finish_reason == "length"} == {"a", "b"}
    assert sched.kv_cache_manager.num_free_blocks == 4


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("chunking", [True, False])
def test_kv_starved_workload_never_preempts_a_request_twice_without_progress(policy, chunking):
    total_preemptions = 0
    for seed in range(5):
        rng = random.Random(seed)
        sched = make_scheduler(num_blocks=12, max_num_seqs=6, budget=16, max_model_len=48, chunking=chunking,
                               policy=policy, caching=False)
        events = _watch_preemptions(sched)
        runner = FakeRunner(sched)
        max_tokens = {}
        for i in range(12):
            max_tokens[f"r{i}"] = rng.randrange(8, 24)
            sched.add_request(make_request(f"r{i}", rng.randrange(4, 16), priority=rng.randrange(3),
                                           max_tokens=max_tokens[f"r{i}"]))
        produced = dict.fromkeys(max_tokens, 0)
        for output in drain(sched, runner):
            produced[output.req_id] += len(output.new_token_ids)
        assert produced == max_tokens  # everything ran to completion
        assert [e for e in events if e[1]] == [], f"seed {seed}: preempted again before progress"
        assert sched.num_preemptions_without_progress == 0
        assert sched.kv_cache_manager.num_free_blocks == 11
        total_preemptions += len(events)
    assert total_preemptions >= 20  # the cache really was starved


def _reference_check_stop(request, max_model_len):
    """check_stop's rules without its pre-check (what it must always agree with)."""
    params = request.sampling_params
    if request.num_output_tokens >= request.max_tokens or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH_CAPPED, None
    if request.num_output_tokens < params.min_tokens:
        return None, None
    last = request.output_token_ids[-1]
    if not params.ignore_eos and request.eos_token_id is not None and last == request.eos_token_id:
        return RequestStatus.FINISHED_STOPPED, None
    if params.stop_token_ids and last in params.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED, last
    return None, None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=12), st.integers(1, 10), st.integers(0, 4), st.booleans(),
       st.sampled_from([None, [], [3], [4, 5]]), st.sampled_from([EOS, None]), st.integers(8, 30))
def test_check_stop_pre_check_agrees_with_the_rules(tokens, max_tokens, min_tokens, ignore_eos, stop_ids, eos,
                                                     max_model_len):
    """check_stop's plain-int pre-check never skips a stop that the rules make, nor changes the outcome."""
    from vllm_jax.scheduler.request import check_stop

    params = SamplingParams(max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens), ignore_eos=ignore_eos,
                            stop_token_ids=stop_ids)
    request = Request(request_id="r", prompt_token_ids=[7] * 5, sampling_params=params, eos_token_id=eos,
                      arrival_time=0.0, seed=0)
    request.max_model_len = max_model_len
    for token in tokens:
        request.append_output_token_ids(token)
        expected = _reference_check_stop(request, max_model_len)
        assert check_stop(request, max_model_len) == (expected[0] is not None)
        if expected[0] is not None:
            assert (request.status, request.stop_reason) == expected
            break


@settings(max_examples=200, deadline=None)
@given(prompt_len=st.integers(1, 12), max_tokens=st.one_of(st.none(), st.integers(1, 12)),
       max_model_len=st.one_of(st.none(), st.integers(2, 24)), outputs=st.integers(0, 12),
       placeholders=st.integers(0, 2))
def test_reaches_its_end_in_flight_is_the_length_rule_with_a_kept_cap(prompt_len, max_tokens, max_model_len, outputs,
                                                                      placeholders):
    """The in-flight token is the last by max_tokens or by the context, as the rule reads, asked before and after
    tokens arrive (the cap it keeps is fixed at arrival)."""
    if max_tokens is None and max_model_len is None:
        max_model_len = 16
    request = Request(request_id="r", prompt_token_ids=[7] * prompt_len, sampling_params=SamplingParams(
        max_tokens=max_tokens), eos_token_id=None, arrival_time=0.0, seed=0)
    request.max_model_len = max_model_len
    for count in range(outputs + 1):
        request.num_output_placeholders = placeholders
        context = max_model_len if max_model_len is not None else float("inf")
        expected = placeholders > 0 and (count + placeholders >= request.max_tokens
                                         or prompt_len + count + placeholders >= context)
        assert request.reaches_its_end_in_flight == expected
        request.append_output_token_ids(3)

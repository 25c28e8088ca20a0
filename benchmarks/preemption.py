"""Preemption under KV starvation, scheduler only (no model: every request samples a token once its known tokens are
computed): the anti-thrashing victim rule against the plain one (fcfs: the last running request; priority: the lowest
priority), over random workloads with arrivals. Reports preemptions, preemptions of a request that had not
progressed since it resumed (thrashing), tokens recomputed because of preemptions, all tokens scheduled, and steps.

    python benchmarks/preemption.py [--seeds 10]
"""

from __future__ import annotations

import argparse
import random

from vllm_jax.config import SchedulerConfig
from vllm_jax.paged_kv.kv_cache_manager import KVCacheManager
from vllm_jax.sampling_params import SamplingParams
from vllm_jax.scheduler.output import ModelRunnerOutput
from vllm_jax.scheduler.request import Request
from vllm_jax.scheduler.scheduler import Scheduler

BLOCK_SIZE = 4
# (usable KV blocks + 1, max_num_seqs, max_num_batched_tokens, requests)
WORKLOADS = [(16, 6, 32, 30), (20, 16, 32, 100), (30, 16, 64, 100)]


def plain_victim(sched: Scheduler) -> Request:
    if sched.config.policy == "priority":
        return max(sched.running, key=lambda r: (r.priority, r.arrival_time))
    return sched.running[-1]


def run(seed: int, rule: bool, policy: str, chunking: bool, num_blocks: int, max_num_seqs: int, budget: int,
        num_requests: int) -> dict[str, int]:
    rng = random.Random(seed)
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=64,
                             enable_chunked_prefill=chunking, policy=policy, min_token_bucket=16, min_seq_bucket=8)
    sched = Scheduler(config, KVCacheManager(num_blocks, BLOCK_SIZE, False, 64), BLOCK_SIZE)
    if not rule:
        sched._pick_victim = lambda: plain_victim(sched)
    counts = dict(preemptions=0, thrashing=0, recomputed=0, scheduled=0, steps=0)
    preempt = sched._preempt

    def counted(request: Request) -> None:
        counts["preemptions"] += 1
        counts["thrashing"] += request.awaiting_progress
        counts["recomputed"] += request.num_computed_tokens
        preempt(request)

    sched._preempt = counted
    added = 0
    while added < num_requests or sched.has_unfinished_requests():
        while added < num_requests and rng.random() < 0.3:
            sched.add_request(Request(
                request_id=f"r{added}", prompt_token_ids=[rng.randrange(3, 1000) for _ in range(rng.randrange(4, 30))],
                sampling_params=SamplingParams(max_tokens=rng.randrange(4, 30), ignore_eos=True), eos_token_id=2,
                arrival_time=float(added), seed=0, priority=rng.randrange(3)))
            added += 1
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        sampled = [[7] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else [] for r in ids]
        sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, logprobs=None,
                                                        prompt_logprobs={}))
        counts["scheduled"] += out.total_num_scheduled_tokens
        counts["steps"] += 1
    assert sched.kv_cache_manager.num_free_blocks == num_blocks - 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    print("| blocks, seqs, budget, requests | victim rule | preemptions | thrashing | recomputed tokens "
          "| scheduled tokens | steps |")
    print("|---|---|---|---|---|---|---|")
    for workload in WORKLOADS:
        for rule in (False, True):
            total: dict[str, int] = {}
            for policy in ("fcfs", "priority"):
                for chunking in (True, False):
                    for seed in range(args.seeds):
                        for key, value in run(seed, rule, policy, chunking, *workload).items():
                            total[key] = total.get(key, 0) + value
            name = "anti-thrashing" if rule else "plain"
            print(f"| {workload} | {name} | {total['preemptions']} | {total['thrashing']} | {total['recomputed']} "
                  f"| {total['scheduled']} | {total['steps']} |")


if __name__ == "__main__":
    main()

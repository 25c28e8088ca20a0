"""Serving statistics: the engine snapshot behind the gauges, and the per-step events behind counters and histograms.

Three kinds of data, all produced on the engine thread and handed to the engine's stat loggers (stat_logger.py):
- `EngineStats`: a frozen snapshot (queue lengths, KV usage, cumulative prefix-cache and preemption counts),
  replaced after every loop iteration.
- `IterationStats`: what one engine step did (tokens scheduled, prompt / generation tokens, TTFTs, inter-token
  latencies, finished requests and, with speculative decoding on, its `SpecDecodingStats`). A logger turns it
  into counter increments and histogram observations.
- `RequestTimer`: one request's timestamps (arrival, first scheduled, first / last token, finish).

Definitions, close to vLLM v1's: prompt tokens are counted once per request when its first token arrives (the
whole prompt, cached tokens included); generation tokens as the engine core produces them (tokens after a stop
string included); a step's iteration tokens are the tokens it scheduled (prefill chunks plus decodes). TTFT and
end-to-end latency run from arrival; queue time from arrival to first scheduling (requests that never ran have
none); inter-token latency is observed once per request per step that gave it tokens, after its first. With
n > 1 the request (not each completion) is timed, and `vllm:request_success` counts each completion.
All intervals use `time.monotonic()`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineStats:
    """Engine state at the end of the latest loop iteration (all zero before the engine is built)."""

    num_requests_running: int = 0  # scheduler requests (n > 1 counts each completion, as in vLLM)
    num_requests_waiting: int = 0  # not scheduled yet, or preempted back to the queue
    kv_cache_usage: float = 0.0  # fraction of the usable KV blocks held by requests, 0..1
    prefix_cache_queries: int = 0  # cumulative, in tokens
    prefix_cache_hits: int = 0  # cumulative, in tokens
    num_preemptions: int = 0  # cumulative
    num_blocks_free: int = 0  # free (or cached but unreferenced) blocks; the null block is never free
    num_blocks_total: int = 0  # every block of the cache, the null block included
    num_steps: int = 0  # engine steps run so far (stays put while the engine sleeps)


def combine_engine_stats(stats: list[EngineStats]) -> EngineStats:
    """Several engines (data-parallel replicas) as one: counts add up, KV usage is weighted by cache size."""
    summed = {f.name: sum(getattr(s, f.name) for s in stats) for f in dataclasses.fields(EngineStats)}
    total = summed["num_blocks_total"] or 1
    summed["kv_cache_usage"] = sum(s.kv_cache_usage * s.num_blocks_total for s in stats) / total
    return EngineStats(**summed)


@dataclass(frozen=True)
class FinishedRequestStats:
    finish_reasons: tuple[str, ...]  # one per completion: "stop" / "length" / "abort"
    num_prompt_tokens: int
    num_generation_tokens: int
    e2e_latency_s: float
    queue_time_s: float | None  # None when the request was never scheduled


@dataclass
class SpecDecodingStats:
    """What speculative decoding did in one iteration, as vLLM's: drafts verified, their tokens, those accepted.

    A draft is one request's proposals verified in one step; `num_accepted_tokens_per_pos[i]` counts the drafts
    whose proposal i was accepted (so it never grows along i), for i < `num_spec_tokens` (k).
    """

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def zeros(cls, num_spec_tokens: int) -> SpecDecodingStats:
        return cls(num_spec_tokens, num_accepted_tokens_per_pos=[0] * num_spec_tokens)


@dataclass
class IterationStats:
    """One loop iteration of the engine thread: the step plus the adds / aborts applied before it."""

    num_scheduled_tokens: int = 0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    time_to_first_tokens_s: list[float] = field(default_factory=list)
    inter_token_latencies_s: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    spec_decoding: SpecDecodingStats | None = None  # None while speculation is off


class RequestTimer:
    """One request's timeline; the engine thread feeds it, `IterationStats` receives what it observes."""

    def __init__(self, arrival: float, num_completions: int):
        self.arrival = arrival
        self.num_completions = num_completions
        self.num_prompt_tokens = 0  # known once the engine has tokenized the prompt
        self.scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.num_generation_tokens = 0
        self.finish_reasons: dict[int, str] = {}  # completion index -> finish reason

    def on_scheduled(self, now: float) -> bool:
        """Record the first scheduling; True the first time only."""
        if self.scheduled is not None:
            return False
        self.scheduled = now
        return True

    def on_tokens(self, now: float, num_tokens: int, it: IterationStats) -> None:
        self.num_generation_tokens += num_tokens
        it.num_generation_tokens += num_tokens
        if self.first_token is None:
            self.first_token = now
            it.num_prompt_tokens += self.num_prompt_tokens
            it.time_to_first_tokens_s.append(now - self.arrival)
        else:
            it.inter_token_latencies_s.append(now - self.last_token)
        self.last_token = now

    def on_finished(self, now: float, it: IterationStats, default_reason: str = "abort") -> None:
        """Close the timeline; completions without a finish reason get `default_reason`."""
        reasons = tuple(self.finish_reasons.get(i, default_reason) for i in range(self.num_completions))
        queue = None if self.scheduled is None else self.scheduled - self.arrival
        it.finished_requests.append(FinishedRequestStats(reasons, self.num_prompt_tokens,
                                                         self.num_generation_tokens, now - self.arrival, queue))

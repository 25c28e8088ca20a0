"""The Prometheus stat logger: vLLM's metric names, so vLLM dashboards and alerts work unchanged.

Each `PrometheusStatLogger` has its own `CollectorRegistry` (never the process-global one), so several engines or
tests can coexist. Counters are declared without `_total`; prometheus_client adds it in the exposition, which
gives exactly vLLM's series names (`vllm:prompt_tokens_total`, `vllm:request_success_total`, ...). Every
series carries vLLM's labels `model_name` and `engine` ("0": data-parallel replicas are summed into one engine).
There are no `_created` series: vLLM turns them off (a switch of prometheus_client's that holds for the whole
process), and so does the first logger created here.

With speculative decoding on (`num_speculative_tokens` given), vLLM's `vllm:spec_decode_*` counters are
registered too, `..._per_pos` with one child per proposal position (label `position`, "0" .. k-1) from the start;
with it off they do not exist, as in vLLM. The acceptance rate is then rate(accepted) / rate(draft_tokens), the
mean acceptance length 1 + rate(accepted) / rate(drafts).

Engines call `record` (stat_logger.py): an iteration's stats become counter increments and histogram
observations, then the gauges are set from the sum of every engine's latest snapshot, so a scrape never sees
"idle" ahead of the counts. The launcher creates the logger and gives it to the engine; the server serves
`render()` (prometheus_client is thread-safe).
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from vllm_jax.metrics.stats import EngineStats, IterationStats, combine_engine_stats

FINISH_REASONS = ("stop", "length", "abort")

# vLLM's buckets (vllm/v1/metrics/loggers.py), so histograms from both engines compare bucket for bucket.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class PrometheusStatLogger:
    """vLLM's Prometheus series for one served model, fed by one engine or by every data-parallel replica."""

    def __init__(self, model_name: str, num_speculative_tokens: int | None = None):
        """`num_speculative_tokens`: k with speculative decoding on; None: no spec-decode series."""
        disable_created_metrics()
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self._snapshots: dict[int, EngineStats] = {}  # engine index -> its latest snapshot
        self._lock = threading.Lock()  # replicas record from their own threads
        reg, names, values = self.registry, ["model_name", "engine"], (model_name, "0")

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=reg).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=reg).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=reg).labels(*values)

        self.num_requests_running = gauge("vllm:num_requests_running",
                                          "Number of requests in model execution batches.")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_cache_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries",
                                            "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits",
                                         "Prefix cache hits, in terms of number of cached tokens.")
        self.num_preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                names + ["finished_reason"], registry=reg)
        # Every reason exists from the start (at 0), as in vLLM, so rate() queries work before the first abort.
        for reason in FINISH_REASONS:
            self.request_success(reason)
        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds",
                                             "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.inter_token_latency = histogram("vllm:inter_token_latency_seconds",
                                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e_request_latency = histogram("vllm:e2e_request_latency_seconds",
                                             "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS)
        self.request_queue_time = histogram("vllm:request_queue_time_seconds",
                                            "Histogram of time spent in WAITING phase for request.",
                                            REQUEST_LATENCY_BUCKETS)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.", ITERATION_TOKEN_BUCKETS)
        self.spec_decode_num_drafts: Counter | None = None
        self.spec_decode_num_draft_tokens: Counter | None = None
        self.spec_decode_num_accepted_tokens: Counter | None = None
        self.spec_decode_num_accepted_tokens_per_pos: list[Counter] = []
        if num_speculative_tokens is not None:
            self.spec_decode_num_drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.spec_decode_num_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
            self.spec_decode_num_accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens",
                                                           "Number of accepted tokens.")
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                              names + ["position"], registry=reg)
            self.spec_decode_num_accepted_tokens_per_pos = [per_pos.labels(*values, str(pos))
                                                            for pos in range(num_speculative_tokens)]

    def record(self, engine_stats: EngineStats, iteration_stats: IterationStats | None = None,
               engine_index: int = 0) -> None:
        """Counts first, then the gauges (the StatLogger protocol)."""
        if iteration_stats is not None:
            self._observe(iteration_stats)
        with self._lock:
            self._snapshots[engine_index] = engine_stats
            total = combine_engine_stats(list(self._snapshots.values()))
            self.num_requests_running.set(total.num_requests_running)
            self.num_requests_waiting.set(total.num_requests_waiting)
            self.kv_cache_usage.set(total.kv_cache_usage)

    def _observe(self, it: IterationStats) -> None:
        """Fold one engine iteration into the counters and histograms."""
        self.prefix_cache_queries.inc(it.prefix_cache_queries)
        self.prefix_cache_hits.inc(it.prefix_cache_hits)
        self.num_preemptions.inc(it.num_preemptions)
        self.prompt_tokens.inc(it.num_prompt_tokens)
        self.generation_tokens.inc(it.num_generation_tokens)
        if it.num_scheduled_tokens:
            self.iteration_tokens.observe(it.num_scheduled_tokens)
        for ttft in it.time_to_first_tokens_s:
            self.time_to_first_token.observe(ttft)
        for itl in it.inter_token_latencies_s:
            self.inter_token_latency.observe(itl)
        spec = it.spec_decoding
        if spec is not None and self.spec_decode_num_drafts is not None:
            self.spec_decode_num_drafts.inc(spec.num_drafts)
            self.spec_decode_num_draft_tokens.inc(spec.num_draft_tokens)
            self.spec_decode_num_accepted_tokens.inc(spec.num_accepted_tokens)
            for child, accepted in zip(self.spec_decode_num_accepted_tokens_per_pos, spec.num_accepted_tokens_per_pos):
                child.inc(accepted)
        for done in it.finished_requests:
            for reason in done.finish_reasons:
                self.request_success(reason).inc()
            self.e2e_request_latency.observe(done.e2e_latency_s)
            if done.queue_time_s is not None:
                self.request_queue_time.observe(done.queue_time_s)

    def request_success(self, finished_reason: str) -> Counter:
        """The `vllm:request_success` child for one finish reason."""
        return self._success.labels(self.model_name, "0", finished_reason)

    def render(self) -> bytes:
        """The Prometheus text exposition of this logger's registry."""
        return generate_latest(self.registry)

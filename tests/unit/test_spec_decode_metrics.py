"""Speculative decoding's metrics (vLLM's `vllm:spec_decode_*` counters) and vLLM's periodic stats log line.

No model and no engine: the scheduler's cumulative counts are a real `SpecDecodeCounts` on a stand-in engine,
the log line runs on a fake clock.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_jax.engine.counters import EngineCounters
from vllm_jax.metrics.logging_stats import LoggingStatLogger, interval_from_env
from vllm_jax.metrics.prometheus import PrometheusStatLogger
from vllm_jax.metrics.stats import EngineStats, IterationStats, SpecDecodingStats
from vllm_jax.scheduler.output import SpecDecodeCounts
from vllm_jax.spec_decode.config import SpeculativeConfig

SPEC_COUNTERS = ["vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total"]


def fake_engine(k: int | None) -> SimpleNamespace:
    """What EngineCounters reads of an LLMEngine: its scheduler, KV-cache manager and config."""
    spec = None if k is None else SpeculativeConfig(method="ngram", num_speculative_tokens=k)
    scheduler = SimpleNamespace(num_preemptions_total=0, num_running=0, num_waiting=0,
                                spec_decode_counts=SpecDecodeCounts())
    kv = SimpleNamespace(prefix_cache_queries=0, prefix_cache_hits=0, usage=0.0, num_free_blocks=0, num_blocks=0)
    return SimpleNamespace(scheduler=scheduler, kv_cache_manager=kv, config=SimpleNamespace(speculative_config=spec))


def deltas(counters: EngineCounters) -> IterationStats:
    it = IterationStats()
    counters.take_deltas(it)
    return it


# ---- EngineCounters -----------------------------------------------------------------------------------------------


def test_take_deltas_gives_what_the_scheduler_counted_since_the_last_call_per_position_too():
    engine = fake_engine(k=3)
    counters = EngineCounters(engine)
    counts = engine.scheduler.spec_decode_counts
    counts.record(2, 2)  # the scheduler's per-position list is only 2 long so far: padded to k
    counts.record(3, 1)
    engine.kv_cache_manager.prefix_cache_queries, engine.kv_cache_manager.prefix_cache_hits = 40, 16
    it = deltas(counters)
    assert it.spec_decoding == SpecDecodingStats(3, num_drafts=2, num_draft_tokens=5, num_accepted_tokens=3,
                                                 num_accepted_tokens_per_pos=[2, 1, 0])
    assert (it.prefix_cache_queries, it.prefix_cache_hits) == (40, 16)  # the other deltas as before
    counts.record(3, 3)
    counts.record(3, 0)
    assert deltas(counters).spec_decoding == SpecDecodingStats(3, 2, 6, 3, [1, 1, 1])
    assert deltas(counters).spec_decoding == SpecDecodingStats.zeros(3)  # nothing new: zeros, still k long
    snap = counters.snapshot()
    assert (snap.prefix_cache_queries, snap.prefix_cache_hits) == (40, 16)


def test_take_deltas_adds_to_the_iteration_spec_stats_already_there():
    engine = fake_engine(k=2)
    counters = EngineCounters(engine)
    engine.scheduler.spec_decode_counts.record(2, 1)
    it = IterationStats(spec_decoding=SpecDecodingStats(2, 1, 2, 2, [1, 1]))
    counters.take_deltas(it)
    assert it.spec_decoding == SpecDecodingStats(2, 2, 4, 3, [2, 1])


def test_take_deltas_leaves_spec_decoding_none_when_speculation_is_off():
    engine = fake_engine(k=None)
    counters = EngineCounters(engine)
    engine.scheduler.spec_decode_counts.record(2, 2)  # never read without a speculative_config
    assert deltas(counters).spec_decoding is None


# ---- Prometheus -----------------------------------------------------------------------------------------------------


def samples(metrics: PrometheusStatLogger) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def spec_value(parsed: dict, name: str, **extra: str) -> float:
    return parsed[(name, tuple(sorted({"model_name": "m", "engine": "0", **extra}.items())))]


def test_spec_counters_have_vllm_names_help_and_one_child_per_position_from_the_start():
    metrics = PrometheusStatLogger("m", num_speculative_tokens=3)
    text = metrics.render().decode()
    assert "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts." in text
    assert "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens." in text
    assert "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens." in text
    assert "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position." in text
    parsed = samples(metrics)
    for name in SPEC_COUNTERS[:3]:
        assert spec_value(parsed, name) == 0
    positions = sorted(dict(key[1])["position"] for key in parsed if key[0] == SPEC_COUNTERS[3])
    assert positions == ["0", "1", "2"]
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 0.0' in text


def test_record_adds_each_iteration_to_the_spec_counters():
    metrics = PrometheusStatLogger("m", num_speculative_tokens=3)
    metrics.record(EngineStats(), IterationStats(spec_decoding=SpecDecodingStats(3, 2, 6, 4, [2, 1, 1])))
    metrics.record(EngineStats(), None)  # a snapshot alone counts nothing
    metrics.record(EngineStats(), IterationStats(spec_decoding=SpecDecodingStats(3, 1, 3, 1, [1, 0, 0])))
    metrics.record(EngineStats(), IterationStats())  # an iteration without spec stats neither
    parsed = samples(metrics)
    assert [spec_value(parsed, name) for name in SPEC_COUNTERS[:3]] == [3, 9, 5]
    assert [spec_value(parsed, SPEC_COUNTERS[3], position=str(i)) for i in range(3)] == [3, 1, 1]


def test_no_spec_counters_without_num_speculative_tokens():
    metrics = PrometheusStatLogger("m")
    metrics.record(EngineStats(), IterationStats(spec_decoding=SpecDecodingStats(3, 2, 6, 4, [2, 1, 1])))
    assert "spec_decode" not in metrics.render().decode()
    assert "vllm:num_requests_running" in metrics.render().decode()


# ---- the periodic log line ----------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture):
    """The INFO lines logged since the last call (DEBUG ones apart)."""
    caplog.set_level(logging.DEBUG, logger="vllm_jax.metrics")

    def take(level: int = logging.INFO) -> list[str]:
        lines = [r.getMessage() for r in caplog.records if r.name == "vllm_jax.metrics" and r.levelno == level]
        if level == logging.INFO:
            caplog.clear()
        return lines

    return take


def tokens(prompt: int = 0, generation: int = 0, spec: SpecDecodingStats | None = None) -> IterationStats:
    return IterationStats(num_prompt_tokens=prompt, num_generation_tokens=generation, spec_decoding=spec)


def test_the_line_gives_throughput_over_the_interval_and_the_latest_snapshot(log):
    clock = FakeClock()
    logger = LoggingStatLogger(interval_s=5.0, clock=clock)
    logger.record(EngineStats(), tokens(prompt=100, generation=10, spec=SpecDecodingStats(3, 4, 12, 6, [3, 2, 1])))
    clock.now += 2
    logger.record(EngineStats(), tokens(generation=15, spec=SpecDecodingStats(3, 4, 12, 4, [3, 1, 0])))
    clock.now += 2.9
    logger.record(EngineStats(), None)
    assert log() == []  # 4.9 s: not yet
    clock.now += 0.1
    snapshot = EngineStats(num_requests_running=3, num_requests_waiting=1, kv_cache_usage=0.25,
                           prefix_cache_queries=200, prefix_cache_hits=50)
    logger.record(snapshot, None)
    line = ("Engine 000: Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: 5.0 tokens/s, Running: 3 "
            "reqs, Waiting: 1 reqs, GPU KV cache usage: 25.0%, Prefix cache hit rate: 25.0%")
    spec_line = ("SpecDecoding metrics: Mean acceptance length: 2.25, Accepted throughput: 2.00 tokens/s, Drafted "
                 "throughput: 4.80 tokens/s, Accepted: 10 tokens, Drafted: 24 tokens, Per-position acceptance rate: "
                 "0.750, 0.375, 0.125, Avg Draft acceptance rate: 41.7%")
    assert log() == [line, spec_line]
    clock.now += 4
    logger.record(snapshot, tokens(generation=40))
    assert log() == []  # at most one line per interval
    clock.now += 4
    logger.record(snapshot, tokens(generation=40))
    (line,) = log()  # 80 tokens over the 8 s since the last line; no drafts in it: no spec line
    assert "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 10.0 tokens/s" in line


def test_idle_intervals_log_nothing_at_info_after_the_one_that_shows_the_drop(log):
    clock = FakeClock()
    logger = LoggingStatLogger(interval_s=5.0, clock=clock)
    logger.record(EngineStats(), None)
    clock.now += 5
    logger.record(EngineStats(), IterationStats())  # nothing happened since the start
    assert len(log(logging.DEBUG)) == 1 and log() == []
    logger.record(EngineStats(), tokens(generation=50))
    clock.now += 5
    logger.record(EngineStats(), None)
    assert len(log()) == 1  # the busy interval
    clock.now += 5
    logger.record(EngineStats(num_requests_waiting=2), IterationStats())
    (drop,) = log()  # vLLM logs the first idle interval after work, with zero throughput
    assert "Avg generation throughput: 0.0 tokens/s" in drop and "Waiting: 2 reqs" in drop
    for _ in range(3):
        clock.now += 5
        logger.record(EngineStats(), IterationStats())
        assert log() == []


def test_each_engine_has_its_own_interval_and_number(log):
    clock = FakeClock()
    logger = LoggingStatLogger(interval_s=1.0, clock=clock)
    logger.record(EngineStats(), tokens(generation=4), engine_index=0)
    logger.record(EngineStats(), tokens(generation=6), engine_index=1)
    clock.now += 2
    logger.record(EngineStats(), None, engine_index=1)
    logger.record(EngineStats(), None, engine_index=0)
    records = log()
    assert [r[:11] for r in records] == ["Engine 001:", "Engine 000:"]
    assert "generation throughput: 3.0 tokens/s" in records[0] and "generation throughput: 2.0 tokens/s" in records[1]


def test_interval_comes_from_vllm_log_stats_interval(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("VLLM_LOG_STATS_INTERVAL", raising=False)
    assert interval_from_env() == 10.0 and LoggingStatLogger().interval_s == 10.0  # vLLM's default
    monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", "2.5")
    assert LoggingStatLogger().interval_s == 2.5
    monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", "0")  # not positive: the default, as vLLM
    assert interval_from_env() == 10.0
    monkeypatch.setenv("VLLM_LOG_STATS_INTERVAL", "soon")
    with pytest.raises(ValueError, match="VLLM_LOG_STATS_INTERVAL"):
        LoggingStatLogger()
    with pytest.raises(ValueError, match="positive"):
        LoggingStatLogger(interval_s=0)


# ---- the launcher -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [None, 4])
def test_launcher_gives_k_to_the_prometheus_logger_and_runs_the_log_line(monkeypatch: pytest.MonkeyPatch, k):
    from vllm_jax.engine import async_llm
    from vllm_jax.server import api_server
    from vllm_jax.server.launcher import _engine_and_app

    built: dict = {}
    monkeypatch.setattr(async_llm, "AsyncLLM", lambda config, **kwargs: built.setdefault("engine", kwargs))
    monkeypatch.setattr(api_server, "build_app", lambda engine, **kwargs: built.setdefault("app", kwargs))
    spec = None if k is None else SpeculativeConfig(method="ngram", num_speculative_tokens=k)
    config = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=1), speculative_config=spec,
                             model_config=SimpleNamespace(served_model_name="m"))
    ns = SimpleNamespace(disable_log_stats=False, max_num_queued_requests=None, api_key=None, chat_template=None,
                         max_request_bytes=None, enable_log_requests=False, enable_tokenizer_info_endpoint=False,
                         enable_auto_tool_choice=False, tool_call_parser=None, responses_store_size=16,
                         disable_responses_store=False)
    _engine_and_app(config, ns, ["m"])
    metrics, line = built["engine"]["stat_loggers"]
    assert built["app"]["metrics"] is metrics and isinstance(line, LoggingStatLogger)
    text = metrics.render().decode()
    assert ("spec_decode" in text) == (k is not None)
    assert text.count("vllm:spec_decode_num_accepted_tokens_per_pos_total{") == (k or 0)
    built.clear()
    _engine_and_app(config, SimpleNamespace(**{**vars(ns), "disable_log_stats": True}), ["m"])
    assert built["engine"]["stat_loggers"] == [] and built["app"]["metrics"] is None

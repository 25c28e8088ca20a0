"""Prometheus metrics under vLLM's exposition names, with values that add up to what the engine actually did."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax import EngineArgs, RequestOutputKind, SamplingParams
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.engine.llm_engine import LLMEngine
from vllm_jax.metrics.prometheus import PrometheusStatLogger
from vllm_jax.metrics.stats import EngineStats, FinishedRequestStats, IterationStats

ARGS = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=64, max_num_seqs=8, max_num_batched_tokens=32)
GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
COUNTERS = ["vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total"]
HISTOGRAMS = ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:iteration_tokens_total"]


def samples(metrics: PrometheusStatLogger) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse the exposition back: (sample name, sorted labels without model_name/engine) -> value."""
    text = metrics.render().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))
            out[(s.name, labels)] = s.value
    return out


def value(parsed: dict, name: str, **labels: str) -> float:
    return parsed[(name, tuple(sorted(labels.items())))]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          output_kind=RequestOutputKind.FINAL_ONLY)


# ---- the logger alone ---------------------------------------------------------------------------------------------


def test_every_vllm_series_is_exposed_with_model_name_before_any_request():
    metrics = PrometheusStatLogger("my-model")
    text = metrics.render().decode()
    parsed = samples(metrics)
    for name in GAUGES + COUNTERS:
        assert any(key[0] == name for key in parsed), name
    for name in HISTOGRAMS:
        assert (f"{name}_count", ()) in parsed and (f"{name}_bucket", (("le", "+Inf"),)) in parsed, name
    assert 'model_name="my-model"' in text and 'engine="0"' in text
    for reason in ("stop", "length", "abort"):  # present at 0 from the start, like vLLM
        assert value(parsed, "vllm:request_success_total", finished_reason=reason) == 0


def test_record_turns_iteration_stats_into_counts_and_observations():
    metrics = PrometheusStatLogger("m")
    metrics.record(EngineStats(), IterationStats(
        num_scheduled_tokens=40, num_prompt_tokens=30, num_generation_tokens=2, num_preemptions=1,
        prefix_cache_queries=30, prefix_cache_hits=16, time_to_first_tokens_s=[0.05, 0.2],
        inter_token_latencies_s=[0.02], finished_requests=[FinishedRequestStats(("stop", "length"), 30, 9, 1.2, 0.1)]))
    metrics.record(EngineStats(), IterationStats())  # an empty iteration changes nothing, observes no iteration size
    metrics.record(EngineStats())  # a snapshot alone touches no counter
    p = samples(metrics)
    assert value(p, "vllm:prompt_tokens_total") == 30 and value(p, "vllm:generation_tokens_total") == 2
    assert value(p, "vllm:num_preemptions_total") == 1
    assert value(p, "vllm:prefix_cache_queries_total") == 30 and value(p, "vllm:prefix_cache_hits_total") == 16
    assert value(p, "vllm:request_success_total", finished_reason="stop") == 1
    assert value(p, "vllm:request_success_total", finished_reason="length") == 1
    assert value(p, "vllm:time_to_first_token_seconds_count") == 2
    assert value(p, "vllm:time_to_first_token_seconds_bucket", le="0.1") == 1
    assert value(p, "vllm:inter_token_latency_seconds_sum") == pytest.approx(0.02)
    assert value(p, "vllm:e2e_request_latency_seconds_count") == 1
    assert value(p, "vllm:request_queue_time_seconds_sum") == pytest.approx(0.1)
    assert value(p, "vllm:iteration_tokens_total_count") == 1 and value(p, "vllm:iteration_tokens_total_sum") == 40


def test_gauges_sum_the_latest_snapshot_of_each_engine():
    """Data-parallel replicas record under their own index: requests add up, KV usage is weighted by cache size,
    and an engine's newer snapshot replaces its older one."""
    metrics = PrometheusStatLogger("m")
    metrics.record(EngineStats(num_requests_running=5, num_requests_waiting=4, kv_cache_usage=0.9,
                               num_blocks_total=11), engine_index=0)
    metrics.record(EngineStats(num_requests_running=2, num_requests_waiting=1, kv_cache_usage=0.5,
                               num_blocks_total=11), engine_index=0)
    metrics.record(EngineStats(num_requests_running=1, kv_cache_usage=0.25, num_blocks_total=33), engine_index=1)
    p = samples(metrics)
    assert value(p, "vllm:num_requests_running") == 3 and value(p, "vllm:num_requests_waiting") == 1
    assert value(p, "vllm:kv_cache_usage_perc") == pytest.approx((0.5 * 11 + 0.25 * 33) / 44)


def test_no_created_series_as_in_vllm():
    metrics = PrometheusStatLogger("m")
    metrics.record(EngineStats(), IterationStats(num_prompt_tokens=3, time_to_first_tokens_s=[0.5]))
    text = metrics.render().decode()
    assert "vllm:prompt_tokens_total" in text and "_created" not in text


def test_two_loggers_do_not_share_a_registry():
    a, b = PrometheusStatLogger("a"), PrometheusStatLogger("b")
    a.record(EngineStats(num_requests_waiting=2), IterationStats(num_generation_tokens=5))
    assert value(samples(a), "vllm:generation_tokens_total") == 5
    assert value(samples(a), "vllm:num_requests_waiting") == 2
    assert value(samples(b), "vllm:generation_tokens_total") == 0
    assert value(samples(b), "vllm:num_requests_waiting") == 0


# ---- through a running engine -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def metrics() -> PrometheusStatLogger:
    """The engine's Prometheus logger, as the launcher wires it."""
    return PrometheusStatLogger("tiny")


@pytest.fixture(scope="module")
def engine(tmp_path_factory, metrics):
    path = tmp_path_factory.mktemp("tiny_llama_metrics")
    make_tiny_checkpoint("llama", path, seed=4)
    llm = AsyncLLM.from_engine_args(EngineArgs(model=str(path), **ARGS), stat_loggers=[metrics],
                                    engine_factory=lambda cfg: LLMEngine(cfg, warmup=False, show_progress=False))
    llm.start()
    llm.wait_until_ready(timeout=120)
    yield llm
    asyncio.run(llm.shutdown())


async def _run(engine: AsyncLLM, prompt: list[int], max_tokens: int, request_id: str):
    return [o async for o in engine.generate(prompt, greedy(max_tokens), request_id)][-1]


def test_counts_and_histograms_add_up_after_a_few_requests(engine, metrics):
    shared = list(range(10, 30))  # 20 tokens: two full blocks of 8 are reusable by the second request
    jobs = [([5, 6, 7], 4), (list(range(40, 55)), 6), (shared, 5)]

    async def main():
        first = await asyncio.gather(*(_run(engine, p, n, f"m{i}") for i, (p, n) in enumerate(jobs)))
        second = await _run(engine, shared + [99], 3, "m-prefix")
        return first + [second]

    before = samples(metrics)
    outs = asyncio.run(main())
    after = samples(metrics)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    prompts = [p for p, _ in jobs] + [shared + [99]]
    generated = [n for _, n in jobs] + [3]
    assert [len(o.outputs[0].token_ids) for o in outs] == generated
    assert delta("vllm:prompt_tokens_total") == sum(map(len, prompts))
    assert delta("vllm:generation_tokens_total") == sum(generated)
    assert delta("vllm:request_success_total", finished_reason="length") == 4
    assert delta("vllm:time_to_first_token_seconds_count") == 4
    assert delta("vllm:e2e_request_latency_seconds_count") == 4
    assert delta("vllm:request_queue_time_seconds_count") == 4
    assert delta("vllm:inter_token_latency_seconds_count") == sum(n - 1 for n in generated)
    assert delta("vllm:prefix_cache_hits_total") == 16 == outs[-1].num_cached_tokens
    assert delta("vllm:prefix_cache_queries_total") >= sum(map(len, prompts))
    # every token the engine computed went through some step: prompts (minus cache hits) plus all decodes
    assert delta("vllm:iteration_tokens_total_sum") == sum(map(len, prompts)) - 16 + sum(n - 1 for n in generated)
    e2e_sum = delta("vllm:e2e_request_latency_seconds_sum")
    assert 0 < delta("vllm:time_to_first_token_seconds_sum") <= e2e_sum
    assert value(after, "vllm:num_preemptions_total") == engine.get_stats().num_preemptions == 0
    for name in GAUGES:
        assert value(after, name) == 0  # idle again


def test_gauges_show_a_request_in_flight_and_its_kv_blocks(engine, metrics):
    gate, entered = threading.Event(), threading.Event()
    parked: list[dict] = []

    def hold() -> None:
        if len(parked) == 0 and engine.get_stats().num_requests_running:
            entered.set()
            gate.wait(30)

    engine.fault_hook = hold

    async def main():
        task = asyncio.create_task(_run(engine, list(range(3, 20)), 10, "gauged"))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        parked.append(samples(metrics))
        gate.set()
        return await task

    try:
        asyncio.run(main())
    finally:
        gate.set()
        engine.fault_hook = None
    during = parked[0]
    assert value(during, "vllm:num_requests_running") == 1 and value(during, "vllm:num_requests_waiting") == 0
    assert value(during, "vllm:kv_cache_usage_perc") == pytest.approx(3 / 63)  # 17 prompt + 1 token: 3 blocks


def test_a_cancelled_request_counts_as_abort(engine, metrics):
    before = value(samples(metrics), "vllm:request_success_total", finished_reason="abort")
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, output_kind=RequestOutputKind.DELTA)

    async def main():
        async with contextlib.aclosing(engine.generate([8, 9], params, "quitter")) as gen:
            async for _ in gen:
                break
        # The engine publishes its counts as soon as it applies the abort (running 0), and the iteration's stats
        # (the abort among them) when the iteration ends: wait for the counter, not for the gauge (a CI run read
        # the metrics in between).
        deadline = time.monotonic() + 30
        while (value(samples(metrics), "vllm:request_success_total", finished_reason="abort") == before
               and time.monotonic() < deadline):
            await asyncio.sleep(0.005)

    asyncio.run(main())
    after = samples(metrics)
    assert value(after, "vllm:request_success_total", finished_reason="abort") == before + 1
    assert value(after, "vllm:num_requests_running") == 0 and value(after, "vllm:kv_cache_usage_perc") == 0


def test_a_request_submitted_during_a_step_counts_as_waiting_at_once(engine, metrics):
    """The engine sees new requests only between steps; the gauge must not wait for the step to end."""
    gate, entered = threading.Event(), threading.Event()

    def hold() -> None:  # the first step with the first request running
        if not gate.is_set() and engine.get_stats().num_requests_running:
            entered.set()
            gate.wait(30)

    engine.fault_hook = hold

    async def main() -> dict:
        first = asyncio.create_task(_run(engine, [3, 4, 5], 4, "running"))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        second = engine.generate([6, 7], greedy(2), "queued-behind")
        pending = asyncio.ensure_future(second.__anext__())
        await asyncio.sleep(0)  # generate() registers the request when first iterated
        during = samples(metrics)
        gate.set()
        await asyncio.gather(first, pending)
        await second.aclose()
        return during

    try:
        during = asyncio.run(main())
    finally:
        gate.set()
        engine.fault_hook = None
    assert value(during, "vllm:num_requests_running") == 1 and value(during, "vllm:num_requests_waiting") == 1

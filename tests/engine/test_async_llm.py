"""AsyncLLM on a tiny random Llama: the serving contract the API server relies on.

Outputs equal the offline engine's; streams concatenate to the final text; a consumer that goes away frees its
KV blocks within a step; rejections (queue full, too long, bad input, duplicate id) come before any output; a
failing step kills the engine loudly instead of hanging; shutdown drains; the event loop never waits on a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pytest

from tests.helpers.tiny_models import VOCAB_SIZE, make_tiny_checkpoint
from vllm_jax import LLM, EngineArgs, RequestOutputKind, SamplingParams
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.engine.errors import EngineDeadError, EngineShutdownError, QueueFullError
from vllm_jax.engine.llm_engine import LLMEngine
from vllm_jax.outputs import RequestOutput

ARGS = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=64, max_num_seqs=8, max_num_batched_tokens=32)
QUEUE_LIMIT = 8
DELTA, FINAL = RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY


def greedy(max_tokens: int, kind: RequestOutputKind = FINAL) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=kind)


def run(coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
    """Run a test coroutine on a fresh loop; a hang fails the test instead of stalling the suite."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def collect(engine: AsyncLLM, prompt: Any, params: SamplingParams, request_id: str) -> list[RequestOutput]:
    return [out async for out in engine.generate(prompt, params, request_id)]


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def drained(engine: AsyncLLM) -> bool:
    stats = engine.get_stats()
    return (stats.num_requests_running == 0 and stats.num_requests_waiting == 0
            and stats.num_blocks_free == stats.num_blocks_total - 1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny_llama_async")
    make_tiny_checkpoint("llama", path, seed=3)
    return str(path)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [rng.integers(3, VOCAB_SIZE, int(n)).tolist() for n in (1, 7, 16, 23, 33, 40)]


@pytest.fixture(scope="module")
def offline(checkpoint: str) -> LLM:
    return LLM(checkpoint, **ARGS)


@pytest.fixture(scope="module")
def reference(offline: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in offline.generate(prompts, greedy(12), use_tqdm=False)]


@pytest.fixture(scope="module")
def engine(offline: LLM, reference: list[list[int]]):
    """One started AsyncLLM for the module; it takes over the offline LLM's warmed-up engine (after `reference`)."""
    llm = AsyncLLM(offline.llm_engine.config, max_num_queued_requests=QUEUE_LIMIT,
                   engine_factory=lambda _: offline.llm_engine)
    llm.start()
    llm.wait_until_ready(timeout=120)
    yield llm
    run(llm.shutdown())


@pytest.fixture
def hook(engine: AsyncLLM):
    """Install a fault_hook for one test; always removed, so a failing test cannot wedge the others."""
    def install(fn: Callable[[], None]) -> None:
        engine.fault_hook = fn
    yield install
    engine.fault_hook = None


def fresh_engine(checkpoint: str) -> AsyncLLM:
    """A private AsyncLLM for tests that kill or stop it; no warm-up (steps compile on first use)."""
    llm = AsyncLLM.from_engine_args(EngineArgs(model=checkpoint, **ARGS),
                                    engine_factory=lambda cfg: LLMEngine(cfg, warmup=False, show_progress=False))
    llm.start()
    llm.wait_until_ready(timeout=120)
    return llm


# ---- outputs ------------------------------------------------------------------------------------------------------


def test_concurrent_requests_give_the_offline_greedy_tokens(engine, prompts, reference):
    async def main():
        return await asyncio.gather(*(collect(engine, p, greedy(12), f"greedy-{i}") for i, p in enumerate(prompts)))

    results = run(main())
    assert [r[-1].outputs[0].token_ids for r in results] == reference
    assert all(len(r) == 1 and r[0].finished for r in results)  # FINAL_ONLY: exactly one output
    assert drained(engine)


def test_delta_stream_concatenates_to_the_final_text(engine):
    prompt = "the quick brown fox"

    async def main():
        return await asyncio.gather(collect(engine, prompt, greedy(20, DELTA), "delta"),
                                    collect(engine, prompt, greedy(20, FINAL), "final"),
                                    collect(engine, prompt, greedy(20, RequestOutputKind.CUMULATIVE), "cumulative"))

    deltas, (final,), cumulative = run(main())
    assert len(deltas) > 1 and all(not o.finished for o in deltas[:-1]) and deltas[-1].finished
    assert "".join(o.outputs[0].text for o in deltas) == final.outputs[0].text == cumulative[-1].outputs[0].text
    assert sum((o.outputs[0].token_ids for o in deltas), []) == final.outputs[0].token_ids
    assert len(final.outputs[0].token_ids) == 20 and final.outputs[0].finish_reason == "length"


def test_n_completions_stream_and_finish_together(engine):
    params = SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=6, ignore_eos=True, output_kind=DELTA)
    outs = run(collect(engine, [5, 6, 7], params, "two"))
    tokens = {0: [], 1: []}
    for out in outs:
        for c in out.outputs:
            tokens[c.index] += c.token_ids
    assert [len(tokens[0]), len(tokens[1])] == [6, 6] and outs[-1].finished
    assert drained(engine)


# ---- cancellation and abort ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["task_cancelled", "iteration_closed"])
def test_consumer_going_away_frees_kv_blocks_within_a_step(engine, hook, how):
    steps = [0]

    def count_steps() -> None:
        steps[0] += 1
        time.sleep(0.005)

    hook(count_steps)

    async def main() -> int:
        received: list[RequestOutput] = []
        got_some = asyncio.Event()

        async def consume() -> None:
            async with contextlib.aclosing(engine.generate([9] * 10, greedy(50, DELTA), "leaver")) as gen:
                async for out in gen:
                    received.append(out)
                    if len(received) == 3:
                        got_some.set()
                        if how == "iteration_closed":
                            break

        task = asyncio.create_task(consume())
        await got_some.wait()
        assert engine.get_stats().num_requests_running == 1
        if how == "task_cancelled":
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        at_abort = steps[0]
        await wait_for(lambda: drained(engine))
        return steps[0] - at_abort

    steps_after = run(main())
    assert steps_after <= 2  # the step in flight plus the idle flush; finishing would take ~47 more


def test_abort_ends_the_stream_with_finish_reason_abort(engine, hook):
    hook(lambda: time.sleep(0.005))

    async def main() -> list[RequestOutput]:
        outs: list[RequestOutput] = []
        async for out in engine.generate([4] * 5, greedy(50, DELTA), "aborted"):
            outs.append(out)
            if len(outs) == 2:
                await engine.abort("aborted")
        return outs

    outs = run(main())
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert sum(len(o.outputs[0].token_ids) for o in outs) < 50
    run(wait_for(lambda: drained(engine)))


# ---- rejections ---------------------------------------------------------------------------------------------------


def test_queue_limit_rejects_with_queue_full_error_before_any_output(engine, hook):
    gate, entered = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        gate.wait(30)

    hook(hold)

    async def main() -> list[list[RequestOutput]]:
        tasks = [asyncio.create_task(collect(engine, [7, 8], greedy(2), "queued-0"))]
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)  # engine parked before scheduling
        tasks += [asyncio.create_task(collect(engine, [7, 8], greedy(2), f"queued-{i}")) for i in range(1, QUEUE_LIMIT)]
        await wait_for(lambda: engine.get_stats().num_requests_waiting == QUEUE_LIMIT)
        with pytest.raises(QueueFullError, match=str(QUEUE_LIMIT)):
            await engine.generate([7, 8], greedy(2), "one-too-many").__anext__()
        gate.set()
        return await asyncio.gather(*tasks)

    try:
        results = run(main())
    finally:
        gate.set()
    assert all(r[-1].outputs[0].finish_reason == "length" for r in results)
    assert drained(engine)


def test_prompt_longer_than_max_model_len_is_a_value_error_naming_the_lengths(engine):
    async def main() -> list[RequestOutput]:
        good = asyncio.create_task(collect(engine, [3] * 10, greedy(8), "good-neighbour"))
        gen = engine.generate([3] * 70, greedy(8), "too-long")
        with pytest.raises(ValueError, match=r"maximum context length is 64 tokens.*has 70 input tokens"):
            await gen.__anext__()
        return await good

    outs = run(main())
    assert len(outs[-1].outputs[0].token_ids) == 8  # a rejected request does not disturb the others
    assert not engine.dead and drained(engine)


@pytest.mark.parametrize("prompt", [3.5, [1, VOCAB_SIZE + 5], {"neither": 1}, []])
def test_bad_prompts_are_value_errors(engine, prompt):
    async def main() -> None:
        with pytest.raises(ValueError):
            await engine.generate(prompt, greedy(4), "bad").__anext__()

    run(main())
    assert not engine.dead and drained(engine)


class PanicException(BaseException):
    """What pyo3 raises when Rust code (the tokenizers library) panics: a BaseException, not an Exception."""


def test_a_tokenizer_panic_fails_its_request_not_the_engine(engine, offline, monkeypatch):
    real = type(offline.llm_engine).add_request

    def panicky(self, request_id, prompt, *args, **kwargs):
        if prompt == "panic":
            raise PanicException("tokenizer panicked")
        return real(self, request_id, prompt, *args, **kwargs)

    monkeypatch.setattr(type(offline.llm_engine), "add_request", panicky)

    async def main() -> list[RequestOutput]:
        with pytest.raises(PanicException):
            await engine.generate("panic", greedy(4), "panics").__anext__()
        return await collect(engine, [5, 6, 7], greedy(3), "after")

    outs = run(main())
    assert len(outs[-1].outputs[0].token_ids) == 3
    assert not engine.dead and drained(engine)


def test_request_id_in_flight_cannot_be_reused_until_it_finishes(engine, hook):
    hook(lambda: time.sleep(0.005))

    async def main() -> None:
        first = engine.generate([5] * 4, greedy(20, DELTA), "dup")
        await first.__anext__()
        with pytest.raises(ValueError, match="already in use"):
            await engine.generate([5] * 4, greedy(2), "dup").__anext__()
        async for _ in first:
            pass
        again = await collect(engine, [5] * 4, greedy(2), "dup")
        assert again[-1].finished

    run(main())


# ---- threading ----------------------------------------------------------------------------------------------------


def test_event_loop_keeps_running_while_a_step_blocks(engine, hook):
    """The first step blocks its thread until the event loop has ticked 20 more times: only an event loop that
    never waits on a step gets there (the 30 s limit just ends a hang)."""
    ticks, reached = [0], []

    def block_until_the_loop_ticks() -> None:
        if reached:
            return
        start, deadline = ticks[0], time.monotonic() + 30
        while ticks[0] < start + 20 and time.monotonic() < deadline:
            time.sleep(0.001)
        reached.append(ticks[0] - start)

    hook(block_until_the_loop_ticks)

    async def main() -> list[RequestOutput]:
        request = asyncio.create_task(collect(engine, [6] * 3, greedy(3), "blocking"))
        while not request.done():
            await asyncio.sleep(0.001)
            ticks[0] += 1
        return await request

    outs = run(main())
    assert reached and reached[0] >= 20
    assert len(outs[-1].outputs[0].token_ids) == 3


def test_idle_engine_sleeps_instead_of_stepping(engine):
    run(collect(engine, [2, 3], greedy(2), "before-idle"))
    steps = engine.get_stats().num_steps
    time.sleep(0.3)
    assert engine.get_stats().num_steps == steps and engine.ready


# ---- death, start-up, shutdown (private engines) ------------------------------------------------------------------


def test_exception_in_a_step_fails_in_flight_requests_and_kills_the_engine(checkpoint):
    llm = fresh_engine(checkpoint)
    steps = [0]

    def fault() -> None:
        steps[0] += 1
        if steps[0] == 4:
            raise RuntimeError("injected fault")

    llm.fault_hook = fault

    async def stream(request_id: str) -> tuple[int, BaseException | None]:
        n = 0
        try:
            async for _ in llm.generate([3, 4, 5], greedy(30, DELTA), request_id):
                n += 1
        except EngineDeadError as exc:
            return n, exc
        return n, None

    async def main():
        results = await asyncio.gather(stream("a"), stream("b"))
        with pytest.raises(EngineDeadError, match="injected fault"):
            await llm.generate([3], greedy(2), "after").__anext__()
        return results

    results = run(main(), timeout=60)
    for received, exc in results:
        assert received >= 1 and isinstance(exc, EngineDeadError) and "injected fault" in str(exc)
    assert llm.dead and not llm.ready and isinstance(llm.error, RuntimeError)


def test_start_up_failure_is_reported_not_hung(checkpoint):
    release = threading.Event()

    def broken_factory(cfg) -> LLMEngine:
        release.wait(30)
        raise OSError("weights unreadable")

    llm = AsyncLLM.from_engine_args(EngineArgs(model=checkpoint, **ARGS), engine_factory=broken_factory)
    llm.start()
    assert not llm.ready and not llm.dead  # still starting: /health must say 503 without calling it dead
    release.set()
    with pytest.raises(EngineDeadError, match="weights unreadable"):
        llm.wait_until_ready(timeout=30)
    assert llm.dead and not llm.ready

    async def main() -> None:
        with pytest.raises(EngineDeadError):
            await llm.generate([3], greedy(2), "x").__anext__()

    run(main())


def test_shutdown_drains_in_flight_requests_then_aborts_the_rest(checkpoint):
    llm = fresh_engine(checkpoint)
    llm.fault_hook = lambda: time.sleep(0.1)

    async def main():
        short = llm.generate([3, 4], greedy(3, DELTA), "short")
        long = llm.generate([5, 6], greedy(40, DELTA), "long")
        firsts = [await short.__anext__(), await long.__anext__()]  # both running (and compiled)
        stopping = asyncio.create_task(llm.shutdown(timeout=1.5))
        await asyncio.sleep(0)
        with pytest.raises(EngineShutdownError):
            await llm.generate([3], greedy(2), "late").__anext__()
        rest = await asyncio.gather(collect_rest(short), collect_rest(long))
        await stopping
        return [[f] + r for f, r in zip(firsts, rest)]

    async def collect_rest(gen) -> list[RequestOutput]:
        return [out async for out in gen]

    short_outs, long_outs = run(main(), timeout=60)
    assert short_outs[-1].outputs[0].finish_reason == "length"
    assert sum(len(o.outputs[0].token_ids) for o in short_outs) == 3
    assert long_outs[-1].outputs[0].finish_reason == "abort"
    assert sum(len(o.outputs[0].token_ids) for o in long_outs) < 40
    assert not llm.ready and not llm.dead and not llm._thread.is_alive()
    assert drained(llm)

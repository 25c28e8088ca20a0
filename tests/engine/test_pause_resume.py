"""AsyncLLM.pause_generation / resume_generation with a request in flight, each of vLLM's modes
(docs/architecture/02-engine.md, "Pause and resume"): "abort" ends it with finish_reason "abort", "wait" returns
once it finished, "keep" freezes it and after resume it ends with the tokens it would have had unpaused. A
request sent while paused is held, then served. The engine thread also runs sleep / wake_up for the caller."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax import EngineArgs, RequestOutputKind, SamplingParams
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.engine.llm_engine import LLMEngine

ARGS = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=32, max_num_seqs=2, max_num_batched_tokens=8,
            enable_sleep_mode=True)
PROMPT = [5, 6, 7, 8]
PARAMS = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, output_kind=RequestOutputKind.DELTA)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("pause") / "llama"
    make_tiny_checkpoint("llama", path, seed=3)
    config = EngineArgs(model=str(path), **ARGS).create_config()
    engine = AsyncLLM(config, engine_factory=lambda cfg: LLMEngine(cfg, warmup=False, show_progress=False))
    engine.start()
    engine.wait_until_ready(120)
    engine.fault_hook = lambda: time.sleep(0.005)  # steps slow enough to pause in the middle of a request
    yield engine
    asyncio.run(engine.shutdown())


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def tokens_of(engine: AsyncLLM, request_id: str, after_first=None) -> tuple[list[int], str | None]:
    """The request's tokens and finish reason; `after_first` is awaited once its first tokens came."""
    tokens, reason = [], None
    async for out in engine.generate(PROMPT, PARAMS, request_id):
        tokens += out.outputs[0].token_ids
        reason = out.outputs[0].finish_reason
        if after_first is not None:
            step, after_first = after_first, None
            await step()
    return tokens, reason


@pytest.fixture(scope="module")
def unpaused(engine):
    return run(tokens_of(engine, "reference"))


def test_keep_freezes_and_continues_with_the_same_tokens(engine, unpaused):
    async def body():
        frozen = []

        async def pause_and_look():
            await engine.pause_generation(mode="keep")
            stats = engine.get_stats()
            frozen.append(stats.num_requests_running)
            await asyncio.sleep(0.2)
            frozen.append(engine.llm_engine.scheduler.running[0].num_output_tokens)
            await asyncio.sleep(0.2)
            frozen.append(engine.llm_engine.scheduler.running[0].num_output_tokens)
            await engine.resume_generation()

        got = await tokens_of(engine, "keep", pause_and_look)
        return got, frozen

    (tokens, reason), frozen = run(body())
    assert frozen[0] == 1 and frozen[1] == frozen[2] < PARAMS.max_tokens
    assert (tokens, reason) == unpaused


def test_abort_ends_the_request_and_holds_new_ones_until_resume(engine, unpaused):
    async def body():
        got = await tokens_of(engine, "abort", lambda: engine.pause_generation(mode="abort"))
        assert await engine.is_paused()
        later = asyncio.ensure_future(tokens_of(engine, "held"))
        await asyncio.sleep(0.2)
        assert not later.done()
        await engine.resume_generation()
        return got, await later

    (tokens, reason), held = run(body())
    assert reason == "abort" and len(tokens) < PARAMS.max_tokens
    assert held == unpaused


def test_wait_returns_once_the_request_finished(engine, unpaused):
    async def body():
        waited = []

        async def pause_waiting():
            waited.append(asyncio.ensure_future(engine.pause_generation(mode="wait")))

        got = await tokens_of(engine, "wait", pause_waiting)
        await waited[0]
        paused = await engine.is_paused()
        await engine.resume_generation()
        return got, paused

    got, paused = run(body())
    assert got == unpaused and paused


def test_sleep_and_wake_through_the_engine_thread(engine, unpaused):
    async def body():
        await engine.sleep(level=1)
        asleep = await engine.is_sleeping()
        await engine.wake_up()
        return asleep, await tokens_of(engine, "woken")

    asleep, got = run(body())
    assert asleep and got == unpaused
    with pytest.raises(ValueError, match="pause mode"):
        run(engine.pause_generation(mode="later"))

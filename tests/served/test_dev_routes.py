"""The RL loop's development routes (server/dev_routes.py): absent (404) without VLLM_SERVER_DEV_MODE=1; with it,
sleep / wake_up / is_sleeping, pause / resume, reset_prefix_cache and update_weights by path work over HTTP,
/health stays 200 while asleep and a generation request then gets a 503 that says the engine sleeps. With data
parallelism every route reaches every replica."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.helpers.live_server import MODEL, serve, tiny_engine_args
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.engine.data_parallel import DataParallelAsyncLLM
from vllm_jax.engine.llm_engine import LLMEngine
from vllm_jax.server.api_server import build_app


def no_warmup(config):
    return LLMEngine(config, warmup=False, show_progress=False)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("dev_routes")
    make_tiny_checkpoint("llama", root / "a", seed=1)
    make_tiny_checkpoint("llama", root / "b", seed=2)
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_SERVER_DEV_MODE", "1")
    # the shapes of tests/engine/test_weight_sync.py's engine: its programs come from the session's compilation cache
    args = tiny_engine_args(root / "a", enable_sleep_mode=True, max_num_seqs=2, max_num_batched_tokens=8,
                            num_gpu_blocks_override=32)
    server = serve(AsyncLLM(args.create_config(), engine_factory=no_warmup))
    yield server, root
    server.stop()
    mp.undo()


def complete(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 6, "temperature": 0.0, "ignore_eos": True})


def test_routes_need_dev_mode(monkeypatch, tmp_path):
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    make_tiny_checkpoint("llama", tmp_path / "a")
    engine = AsyncLLM(tiny_engine_args(tmp_path / "a").create_config())  # never started: the routes only
    paths = {route.path for route in build_app(engine, served_model_names=[MODEL], api_key=None,
                                               chat_template=None).routes}
    assert "/health" in paths and not paths & {"/sleep", "/wake_up", "/pause", "/update_weights"}


def test_sleep_wake_pause_and_update_over_http(served):
    server, root = served
    url = server.url
    first = complete(url).json()["choices"][0]["text"]
    assert httpx.post(f"{url}/sleep", params={"level": 1}).status_code == 200
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": True}
    assert httpx.get(f"{url}/health").status_code == 200
    asleep = complete(url)
    assert asleep.status_code == 503 and "sleeping" in asleep.json()["error"]["message"]
    assert httpx.post(f"{url}/wake_up", params={"tags": ["weights", "kv_cache"]}).status_code == 200
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": False}
    assert complete(url).json()["choices"][0]["text"] == first

    assert httpx.post(f"{url}/pause", params={"mode": "wait"}).status_code == 200
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": True}
    assert httpx.post(f"{url}/resume").status_code == 200
    assert httpx.post(f"{url}/reset_prefix_cache").json() == {"reset": True}

    assert httpx.post(f"{url}/update_weights", json={"path": str(root / "b")}, timeout=60).status_code == 200
    assert complete(url).json()["choices"][0]["text"] != first
    httpx.post(f"{url}/update_weights", json={"path": str(root / "a")}, timeout=60)
    assert complete(url).json()["choices"][0]["text"] == first
    bad = httpx.post(f"{url}/update_weights", json={"path": str(root / "missing")})
    assert bad.status_code == 400 and "missing" in bad.json()["error"]["message"]
    assert httpx.post(f"{url}/sleep", params={"level": 5}).status_code == 400


@pytest.fixture(scope="module")
def served_dp(tmp_path_factory):
    """Two data-parallel replicas (devices 0 and 1) of the same tiny llama, behind one dev-mode server."""
    root = tmp_path_factory.mktemp("dev_routes_dp")
    make_tiny_checkpoint("llama", root / "a", seed=1)
    make_tiny_checkpoint("llama", root / "b", seed=2)
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_SERVER_DEV_MODE", "1")
    args = tiny_engine_args(root / "a", enable_sleep_mode=True, max_num_seqs=2, max_num_batched_tokens=8,
                            num_gpu_blocks_override=32, data_parallel_size=2)
    server = serve(DataParallelAsyncLLM(args.create_config(), warmup=False))
    yield server, root
    server.stop()
    mp.undo()


def test_data_parallel_routes_reach_every_replica(served_dp):
    server, root = served_dp
    url, engine = server.url, server.engine
    first = complete(url).json()["choices"][0]["text"]
    assert httpx.post(f"{url}/sleep", params={"level": 1}).status_code == 200
    assert [r.llm_engine.is_sleeping() for r in engine.replicas] == [True, True]
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": True}
    assert httpx.post(f"{url}/wake_up").status_code == 200
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": False}

    assert httpx.post(f"{url}/update_weights", json={"path": str(root / "b")}, timeout=60).json()["updated"] > 0
    before = engine.requests_per_replica
    body = {"model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    long = {**body, "max_tokens": 48, "stream": True}  # still running when the second request arrives
    with httpx.stream("POST", f"{url}/v1/completions", json=long, timeout=120) as stream:
        lines = stream.iter_lines()
        held = [next(lines)]  # the first request is in flight on one replica, so the second goes to the other
        second = complete(url).json()["choices"][0]["text"]
        held.extend(lines)
    streamed = "".join(json.loads(line[6:])["choices"][0]["text"] for line in held
                       if line.startswith("data: {"))
    assert [a - b for a, b in zip(engine.requests_per_replica, before)] == [1, 1]
    assert streamed.startswith(second) and second != first  # greedy: the same first 6 tokens on both replicas

    assert httpx.post(f"{url}/pause", params={"mode": "keep"}).status_code == 200
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": True}
    assert httpx.post(f"{url}/resume").status_code == 200
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": False}
    assert httpx.post(f"{url}/reset_prefix_cache").json() == {"reset": True}
    bad = httpx.post(f"{url}/sleep", params={"level": 5})
    assert bad.status_code == 400 and "2 of 2 data-parallel replicas" in bad.json()["error"]["message"]


class _Replica:
    """A stand-in replica whose sleep fails or succeeds."""

    def __init__(self, error: Exception | None):
        self.error, self.asleep = error, False

    async def sleep(self, level: int) -> None:
        if self.error:
            raise self.error
        self.asleep = True


def test_a_failing_replica_is_named_and_the_others_state_is_said():
    engine = DataParallelAsyncLLM.__new__(DataParallelAsyncLLM)
    engine.replicas = [_Replica(None), _Replica(RuntimeError("cannot sleep with 1 request(s) in flight")),
                       _Replica(None)]
    with pytest.raises(RuntimeError) as info:
        asyncio.run(engine.sleep(1))
    assert str(info.value) == ("sleep failed on 1 of 3 data-parallel replicas (replica 1: cannot sleep with 1 "
                               "request(s) in flight); replica(s) [0, 2] did sleep")
    assert [r.asleep for r in engine.replicas] == [True, False, True]

"""The RL loop's development routes (server/dev_routes.py): absent (404) without VLLM_SERVER_DEV_MODE=1; with it,
sleep / wake_up / is_sleeping, pause / resume, reset_prefix_cache and update_weights by path work over HTTP,
/health stays 200 while asleep and a generation request then gets a 503 that says the engine sleeps."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.live_server import MODEL, serve, tiny_engine_args
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.engine.async_llm import AsyncLLM
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
    # the shapes of tests/test_weight_sync.py's engine: its programs come from the session's compilation cache
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

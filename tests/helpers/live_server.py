"""A tiny random Llama behind the real app and uvicorn on 127.0.0.1 (a free port), for the bad-input, fuzzing and
security tests: `start_server` returns once /health says 200; `openai_error` checks an error response's body.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.config import EngineArgs
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.server.api_server import build_app
from vllm_jax.server.launcher import HttpServer, bind_socket, serve_in_thread

MODEL = "tiny-llama"
MAX_MODEL_LEN = 64  # keeps every generation short: prompt + max_tokens <= 64 tokens
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
ERROR_FIELDS = {"message", "type", "param", "code"}


@dataclass
class Served:
    url: str
    app: FastAPI
    engine: AsyncLLM
    server: HttpServer
    thread: threading.Thread

    def stop(self) -> None:
        self.server.request_exit()
        self.thread.join(timeout=30)

    def assert_idle(self, timeout: float = 10.0) -> None:
        """No request running or waiting and every KV block free (the null block never is)."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.engine.get_stats()
            idle = (stats.num_requests_running, stats.num_requests_waiting) == (0, 0)
            if idle and stats.num_blocks_free == stats.num_blocks_total - 1:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the engine is not idle: {stats}")
            time.sleep(0.05)


def tiny_checkpoint(root: Path) -> Path:
    path = root / "llama"
    make_tiny_checkpoint("llama", path)
    return path


def start_server(checkpoint: Path, *, access_log: bool = False, **app_kwargs: Any) -> Served:
    """Serve the tiny model; `app_kwargs` go to build_app (api_key, max_request_bytes, log_requests, ...)."""
    args = EngineArgs(model=str(checkpoint), max_model_len=MAX_MODEL_LEN, block_size=8, num_gpu_blocks_override=64,
                      max_num_seqs=8, max_num_batched_tokens=32)
    engine = AsyncLLM.from_engine_args(args)
    app = build_app(engine, served_model_names=[MODEL], chat_template=TEMPLATE,
                    **{"api_key": None, **app_kwargs})
    server = HttpServer(app, engine, log_level="info" if access_log else "warning", access_log=access_log)
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    thread = serve_in_thread(server, sock)
    served = Served(url, app, engine, server, thread)
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return served
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            served.stop()
            raise TimeoutError(f"{url} did not become healthy")
        time.sleep(0.05)


def openai_error(resp: httpx.Response, status: int | None = None) -> dict[str, Any]:
    """The `error` object of a response, after checking it has OpenAI's shape (and `status`, if given)."""
    if status is not None:
        assert resp.status_code == status, (resp.status_code, resp.text[:500])
    assert 400 <= resp.status_code < 600, (resp.status_code, resp.text[:500])
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_FIELDS, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"], body
    assert isinstance(err["type"], str) and err["type"], body
    return err

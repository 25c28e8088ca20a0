"""A real server for the HTTP tests: uvicorn on 127.0.0.1 (a free port) in a thread of this process, serving a
real AsyncLLM over a tiny random Llama, so a test drives it over HTTP and still reads the engine's state directly.

`start_server(checkpoint)` builds the engine from `tiny_engine_args`; `serve(engine)` serves one a test built
itself (a fault hook, other limits, an engine that never becomes ready).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
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
LETTERS = list(range(259, 259 + 26))  # tests/helpers/tiny_models.py: 'a'..'z' are token ids 259..284
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
READY_TIMEOUT_S = 300.0  # warm-up compiles every bucket: minutes on a loaded 2-core machine


@dataclass
class Served:
    url: str
    engine: AsyncLLM
    server: HttpServer
    thread: threading.Thread
    app: FastAPI

    def stop(self, timeout: float = 30.0) -> None:
        self.server.request_exit()
        self.thread.join(timeout=timeout)

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
    """A tiny random Llama written to root/llama."""
    path = root / "llama"
    make_tiny_checkpoint("llama", path)
    return path


def tiny_engine_args(checkpoint: Path, **overrides: Any) -> EngineArgs:
    """Small enough to warm up fast on CPU; `overrides` replace any of the defaults. One token bucket and one
    sequence bucket unless overridden: a tiny model runs a padded step in microseconds, and each bucket is one
    more set of programs to compile (docs/contributing/testing.md, "Compile time")."""
    args = {**dict(max_model_len=MAX_MODEL_LEN, block_size=8, num_gpu_blocks_override=64, max_num_seqs=8,
                   max_num_batched_tokens=32), **overrides}
    args.setdefault("min_token_bucket", args["max_num_batched_tokens"])
    args.setdefault("min_seq_bucket", args["max_num_seqs"])
    return EngineArgs(model=str(checkpoint), **args)


def serve(engine: AsyncLLM, *, model_names: Sequence[str] = (MODEL,), shutdown_timeout: float = 0.0,
          access_log: bool = False, wait_ready: bool = True, **app_kwargs: Any) -> Served:
    """Serve `engine`; returns once /health says 200 (or, with `wait_ready=False`, once the port answers at all).
    `app_kwargs` go to build_app (api_key, max_request_bytes, log_requests, tool flags, chat_template: None for
    the tokenizer's own)."""
    app = build_app(engine, served_model_names=list(model_names),
                    **{"api_key": None, "chat_template": TEMPLATE, **app_kwargs})
    server = HttpServer(app, engine, shutdown_timeout=shutdown_timeout,
                        log_level="info" if access_log else "warning", access_log=access_log)
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    served = Served(url, engine, server, serve_in_thread(server, sock), app)
    try:
        _wait_until(url, "/health" if wait_ready else "/version", READY_TIMEOUT_S, served.thread)
    except BaseException:
        served.stop()
        raise
    return served


def start_server(checkpoint: Path, **serve_kwargs: Any) -> Served:
    """The tiny model with `tiny_engine_args` behind the real app; `serve_kwargs` as for `serve`."""
    return serve(AsyncLLM.from_engine_args(tiny_engine_args(checkpoint)), **serve_kwargs)


def wait_healthy(url: str, timeout: float) -> None:
    """Until `url`/health says 200; TimeoutError after `timeout` seconds."""
    _wait_until(url, "/health", timeout)


def _wait_until(url: str, path: str, timeout: float, thread: threading.Thread | None = None) -> None:
    """Poll `path` until it answers 200 (a deadline that only stops a hang, or a server thread that died)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}{path}", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or (thread is not None and not thread.is_alive()):
            raise TimeoutError(f"{url}{path} did not answer 200 within {timeout} s")
        time.sleep(0.05)

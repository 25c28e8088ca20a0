"""A real server for reliability tests: uvicorn on 127.0.0.1 (a free port) in a thread of this process, serving
a real AsyncLLM, so a test can drive it over HTTP and still read the engine's state directly. Plus small readers
for OpenAI error bodies and Prometheus text.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.server.api_server import build_app
from vllm_jax.server.launcher import HttpServer, bind_socket, serve_in_thread

MODEL = "tiny-llama"
LETTERS = list(range(259, 259 + 26))  # tests/helpers/tiny_models.py: 'a'..'z' are token ids 259..284
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


@dataclass
class Served:
    url: str
    engine: AsyncLLM
    server: HttpServer
    thread: threading.Thread

    def stop(self, timeout: float = 30.0) -> None:
        self.server.request_exit()
        self.thread.join(timeout=timeout)


def serve(engine: AsyncLLM, *, shutdown_timeout: float = 0.0, ready_timeout: float = 300.0) -> Served:
    """Start `engine` behind the OpenAI app and wait until /health says 200."""
    app = build_app(engine, served_model_names=[MODEL], api_key=None, chat_template=TEMPLATE)
    server = HttpServer(app, engine, shutdown_timeout=shutdown_timeout, log_level="warning", access_log=False)
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    thread = serve_in_thread(server, sock)
    wait_healthy(url, ready_timeout)
    return Served(url, engine, server, thread)


def wait_healthy(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} was not healthy within {timeout} s")
        time.sleep(0.1)


def openai_error(body: Any) -> dict:
    """The error object of an OpenAI error body `{"error": {"message", "type", "param", "code"}}`."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"], body
    return body["error"]


def error_of(status_code: int, body: Any, status: int) -> dict:
    """The OpenAI error object of a response that must have `status`."""
    assert status_code == status, body
    return openai_error(body)


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus exposition (0 when absent: counters appear once they have a value)."""
    for line in text.splitlines():
        m = re.match(r"^([^{\s]+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return 0.0


def wait_idle_metrics(url: str, timeout: float = 20.0) -> str:
    """Poll /metrics until nothing runs, waits or holds KV blocks; return the last exposition either way."""
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        busy = (metric(text, "vllm:num_requests_running") + metric(text, "vllm:num_requests_waiting")
                + metric(text, "vllm:kv_cache_usage_perc"))
        if busy == 0 or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def make_checkpoint(path: Path) -> Path:
    from tests.helpers.tiny_models import make_tiny_checkpoint

    make_tiny_checkpoint("llama", path)
    return path

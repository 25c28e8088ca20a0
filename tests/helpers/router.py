"""vllm-router (the real router, its PyPI package's Rust binary) in front of live servers: started on a free
loopback port, waited for until it answers, stopped by its process id."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def vllm_router(*worker_urls: str, policy: str = "round_robin", timeout: float = 60.0) -> Iterator[str]:
    """The router's base URL while it routes to `worker_urls`; the test fails naming the router's output when it
    does not come up within `timeout` seconds."""
    binary = shutil.which("vllm-router")
    assert binary, "vllm-router is not installed (pip install -e '.[test]' brings it)"
    port = _free_port()
    proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
                             "--worker-urls", *worker_urls], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"vllm-router exited {proc.returncode}: {proc.stdout.read()[-3000:]}"
            try:
                if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "vllm-router did not answer /v1/models in time"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

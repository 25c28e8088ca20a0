"""Faults against a real server: an exception inside an engine step, and shutdown (SIGTERM, or request_exit) with
requests in flight.

Fault policy: an exception inside a step leaves the device state unknown (the KV cache was donated to the failed
step), so the engine is marked dead. Every request it held fails with a 500-class OpenAI error body — a stream with
one `data: {"error": ...}` event then `data: [DONE]`, a non-streaming request (or a stream with no output yet) with
HTTP 500 — `/health` turns 503 and every new request gets 503 at once. Nothing waits on the dead engine.

Drain: the listener closes and the engine accepts nothing new; in-flight requests finish for up to
--shutdown-timeout seconds, the rest end with finish_reason "abort"; the process exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.http_checks import error_body, metric, openai_error
from tests.helpers.live_server import LETTERS, MODEL, Served, serve, tiny_checkpoint, tiny_engine_args, wait_healthy
from tests.helpers.processes import unoptimized
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.metrics.prometheus import PrometheusStatLogger

LONG = {"allowed_token_ids": LETTERS, "ignore_eos": True, "temperature": 0}  # one letter per token, never EOS


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("faults"))


def _engine(checkpoint: Path, **kwargs: Any) -> AsyncLLM:
    return AsyncLLM.from_engine_args(tiny_engine_args(checkpoint, max_model_len=128), **kwargs)


@pytest.fixture
def server_factory() -> Iterator[list[Served]]:
    """Servers a test starts; each is stopped afterwards, and must actually stop."""
    started: list[Served] = []
    yield started
    for s in started:
        s.stop(timeout=30)
        assert not s.thread.is_alive(), "the server thread did not stop"


async def _read_stream(client: httpx.AsyncClient, path: str, body: dict, got_output: asyncio.Event) -> list[str]:
    """All SSE payloads of a stream that must start with 200; sets `got_output` once some text arrived."""
    payloads: list[str] = []
    async with client.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                payloads.append(line[len("data: "):])
                if payloads[-1] != "[DONE]":
                    choice = (json.loads(payloads[-1]).get("choices") or [{}])[0]
                    if choice.get("text") or (choice.get("delta") or {}).get("content"):
                        got_output.set()
    return payloads


# ---- an exception inside an engine step -------------------------------------------------------------------------

class StepFault:
    """fault_hook: slows every step; once armed, raises in the first step that has a request waiting (so a request
    that never produced output is in flight too)."""

    def __init__(self, engine: AsyncLLM):
        self.engine, self.armed, self.fired = engine, False, 0

    def __call__(self) -> None:
        if self.armed and self.engine.get_stats().num_requests_waiting > 0:
            self.fired += 1
            raise RuntimeError("injected fault")
        time.sleep(0.02)


def test_step_exception_fails_in_flight_requests_with_500_then_health_and_new_requests_503(
        checkpoint: Path, server_factory: list[Served]) -> None:
    metrics = PrometheusStatLogger(MODEL)
    engine = _engine(checkpoint, stat_loggers=[metrics])
    fault = StepFault(engine)
    s = serve(engine, metrics=metrics)
    server_factory.append(s)
    engine.fault_hook = fault
    completion = {"model": MODEL, "prompt": "fault", "max_tokens": 100, **LONG}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "fault"}], "max_tokens": 100, **LONG}

    async def scenario() -> dict:
        async with httpx.AsyncClient(base_url=s.url, timeout=httpx.Timeout(20, connect=5)) as client:
            seen = [asyncio.Event(), asyncio.Event()]
            streams = [asyncio.create_task(_read_stream(client, "/v1/completions", completion, seen[0])),
                       asyncio.create_task(_read_stream(client, "/v1/chat/completions", chat, seen[1]))]
            posts = [asyncio.create_task(client.post("/v1/completions", json=completion)),
                     asyncio.create_task(client.post("/v1/chat/completions", json=chat))]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in seen)), 20)
            deadline = time.monotonic() + 20
            while engine.get_stats().num_requests_running < 4:  # the non-streaming ones are generating too
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            fault.armed = True
            late = await client.post("/v1/completions", json={**completion, "stream": True})  # no output yet
            out = {"streams": await asyncio.gather(*streams), "posts": await asyncio.gather(*posts), "late": late,
                   "health": await client.get("/health"), "metrics": await client.get("/metrics")}
            # a request that waited on the dead engine would never be answered: the client's timeout stops that
            out["refused"] = [await client.post(path, json=body) for path, body in (
                ("/v1/completions", completion), ("/v1/chat/completions", {**chat, "stream": True}))]
            return out

    out = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert fault.fired == 1 and engine.dead and not engine.ready

    for payloads in out["streams"]:  # text, then one error event, then [DONE]
        assert payloads[-1] == "[DONE]"
        err = error_body(json.loads(payloads[-2]))
        assert err["type"] == "server_error" and err["code"] == "engine_dead" and "injected fault" in err["message"]
        chunks = [json.loads(p) for p in payloads[:-2]]
        assert chunks and all("error" not in c for c in chunks)
        assert all(ch.get("finish_reason") is None for c in chunks for ch in c["choices"])
    for resp in out["posts"] + [out["late"]]:
        err = openai_error(resp, 500)
        assert err["type"] == "server_error" and err["code"] == "engine_dead" and "injected fault" in err["message"]

    assert openai_error(out["health"], 503)["code"] == "engine_dead"
    assert out["metrics"].status_code == 200  # the failed requests neither run nor wait any more
    assert metric(out["metrics"].text, "vllm:num_requests_running") == 0
    assert metric(out["metrics"].text, "vllm:num_requests_waiting") == 0
    for resp in out["refused"]:
        assert openai_error(resp, 503)["code"] == "engine_dead"


# ---- draining on shutdown ---------------------------------------------------------------------------------------

class SlowSteps:
    """fault_hook: makes every step take at least `seconds` and counts the steps."""

    def __init__(self, seconds: float):
        self.seconds, self.count = seconds, 0

    def __call__(self) -> None:
        self.count += 1
        time.sleep(self.seconds)


def test_shutdown_finishes_short_requests_and_aborts_long_ones_after_the_timeout(
        checkpoint: Path, server_factory: list[Served]) -> None:
    engine = _engine(checkpoint)
    s = serve(engine, shutdown_timeout=1.0)
    server_factory.append(s)
    steps = SlowSteps(0.05)  # >= 50 ms a step: 100 tokens take >= 5 s
    engine.fault_hook = steps
    long_body = {"model": MODEL, "prompt": "long", "max_tokens": 100, **LONG}
    short_body = {"model": MODEL, "prompt": "short", "max_tokens": 5, **LONG}

    async def scenario() -> dict:
        async with httpx.AsyncClient(base_url=s.url, timeout=httpx.Timeout(20, connect=5)) as client:
            seen = asyncio.Event()
            stream = asyncio.create_task(_read_stream(client, "/v1/completions", long_body, seen))
            long_post = asyncio.create_task(client.post("/v1/completions", json=long_body))
            await asyncio.wait_for(seen.wait(), 20)
            short_post = asyncio.create_task(client.post("/v1/completions", json=short_body))
            deadline = time.monotonic() + 20
            while engine.get_stats().num_requests_running < 3 and not short_post.done():  # the short one runs
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            steps_before_exit = steps.count
            s.server.request_exit()
            await asyncio.sleep(0.5)
            try:  # a new connection: refused once the listener closed (503 if it slipped in before)
                async with httpx.AsyncClient(base_url=s.url, timeout=5) as fresh:
                    new_outcome = (await fresh.post("/v1/completions", json=short_body)).status_code
            except httpx.TransportError as exc:
                new_outcome = type(exc).__name__
            results = await asyncio.gather(stream, long_post, short_post)
            return {"stream": results[0], "long": results[1], "short": results[2], "new": new_outcome,
                    "steps_during_drain": steps.count - steps_before_exit}

    out = asyncio.run(asyncio.wait_for(scenario(), 60))
    s.thread.join(timeout=10)
    assert not s.thread.is_alive()

    short = out["short"].json()["choices"][0]
    assert out["short"].status_code == 200 and short["finish_reason"] == "length" and len(short["text"]) == 5
    long = out["long"].json()["choices"][0]
    assert out["long"].status_code == 200 and long["finish_reason"] == "abort"
    payloads = out["stream"]
    assert payloads[-1] == "[DONE]"
    last = json.loads(payloads[-2])["choices"][0]
    assert last["finish_reason"] == "abort"
    assert len("".join(json.loads(p)["choices"][0]["text"] for p in payloads[:-1])) < 100
    assert out["new"] in ("ConnectError", 503), out["new"]
    # the drain kept stepping past the short request's 5 tokens: the long ones ran on until the timeout
    assert out["steps_during_drain"] > short_body["max_tokens"], out["steps_during_drain"]
    assert engine.get_stats().num_blocks_free == engine.get_stats().num_blocks_total - 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_sigterm_drains_the_stream_in_flight_refuses_new_requests_and_exits_0(checkpoint: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    exe = Path(sys.executable).parent / "vllm-jax"  # this environment's entry point, not another one on PATH
    command = [str(exe)] if exe.is_file() else [sys.executable, "-m", "vllm_jax.cli"]
    command += ["serve", str(checkpoint), "--port", str(port), "--shutdown-timeout", "5", "--max-model-len", "256",
                "--block-size", "8", "--num-gpu-blocks-override", "40", "--max-num-seqs", "4",
                "--max-num-batched-tokens", "32", "--min-token-bucket", "32", "--min-seq-bucket", "4",  # one bucket
                "--uvicorn-log-level", "warning"]
    env = unoptimized({**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True)  # never blocks on a full pipe
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, "".join(log)
            try:
                wait_healthy(url, 1)
                break
            except TimeoutError:
                assert time.monotonic() < deadline, "".join(log)
        events_after_signal = 0
        payloads: list[str] = []
        signalled = False
        body = {"prompt": "drain", "max_tokens": 240, "stream": True, **LONG}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                payloads.append(line[len("data: "):])
                if not signalled:
                    proc.send_signal(signal.SIGTERM)
                    signalled = True
                    time.sleep(0.5)  # the listener closes meanwhile
                    with pytest.raises(httpx.TransportError):  # new connections are refused
                        httpx.get(f"{url}/health", timeout=2)
                else:
                    events_after_signal += 1
        code = proc.wait(timeout=5 + 15)  # a deadline that only stops a hang
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=5)
    assert code == 0, "".join(log)
    assert payloads[-1] == "[DONE]"
    reason = json.loads(payloads[-2])["choices"][0]["finish_reason"]
    text = "".join(json.loads(p)["choices"][0]["text"] for p in payloads[:-1])
    assert events_after_signal > 10  # the request was still generating when the signal came, and went on
    if reason == "length":  # finished within the timeout (the usual case on an idle machine)
        assert len(text) == 240
    else:  # a very slow machine: aborted once the timeout passed
        assert reason == "abort" and len(text) < 240
    print(f"\nSIGTERM drain: finish_reason {reason}, {events_after_signal} events after the signal, exit 0")
    assert "Traceback" not in "".join(log), "".join(log)

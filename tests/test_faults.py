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
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.serving_harness import (LETTERS, MODEL, Served, error_of, make_checkpoint, metric, openai_error, serve,
                                   wait_healthy)
from vllm_jax.config import EngineArgs
from vllm_jax.engine.async_llm import AsyncLLM

LONG = {"allowed_token_ids": LETTERS, "ignore_eos": True, "temperature": 0}  # one letter per token, never EOS


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("faults") / "llama")


def _engine(checkpoint: Path) -> AsyncLLM:
    return AsyncLLM.from_engine_args(EngineArgs(
        model=str(checkpoint), max_model_len=128, block_size=8, num_gpu_blocks_override=64, max_num_seqs=8,
        max_num_batched_tokens=32))


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
    engine = _engine(checkpoint)
    fault = StepFault(engine)
    s = serve(engine)
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
            refused = []
            for path, body in (("/v1/completions", completion), ("/v1/chat/completions", {**chat, "stream": True})):
                t0 = time.monotonic()
                refused.append((await client.post(path, json=body), time.monotonic() - t0))
            out["refused"] = refused
            return out

    out = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert fault.fired == 1 and engine.dead and not engine.ready

    for payloads in out["streams"]:  # text, then one error event, then [DONE]
        assert payloads[-1] == "[DONE]"
        err = openai_error(json.loads(payloads[-2]))
        assert err["type"] == "server_error" and err["code"] == "engine_dead" and "injected fault" in err["message"]
        chunks = [json.loads(p) for p in payloads[:-2]]
        assert chunks and all("error" not in c for c in chunks)
        assert all(ch.get("finish_reason") is None for c in chunks for ch in c["choices"])
    for resp in out["posts"] + [out["late"]]:
        err = error_of(resp.status_code, resp.json(), 500)
        assert err["type"] == "server_error" and err["code"] == "engine_dead" and "injected fault" in err["message"]

    assert error_of(out["health"].status_code, out["health"].json(), 503)["code"] == "engine_dead"
    assert out["metrics"].status_code == 200  # the failed requests neither run nor wait any more
    assert metric(out["metrics"].text, "vllm:num_requests_running") == 0
    assert metric(out["metrics"].text, "vllm:num_requests_waiting") == 0
    for resp, seconds in out["refused"]:
        assert error_of(resp.status_code, resp.json(), 503)["code"] == "engine_dead"
        assert seconds < 2.0  # at once: nothing waits on a dead engine


# ---- draining on shutdown ---------------------------------------------------------------------------------------

def test_shutdown_finishes_short_requests_and_aborts_long_ones_after_the_timeout(
        checkpoint: Path, server_factory: list[Served]) -> None:
    engine = _engine(checkpoint)
    s = serve(engine, shutdown_timeout=1.0)
    server_factory.append(s)
    engine.fault_hook = lambda: time.sleep(0.05)  # >= 50 ms a step: 100 tokens take >= 5 s
    long_body = {"model": MODEL, "prompt": "long", "max_tokens": 100, **LONG}
    short_body = {"model": MODEL, "prompt": "short", "max_tokens": 5, **LONG}

    async def scenario() -> dict:
        async with httpx.AsyncClient(base_url=s.url, timeout=httpx.Timeout(20, connect=5)) as client:
            seen = asyncio.Event()
            stream = asyncio.create_task(_read_stream(client, "/v1/completions", long_body, seen))
            long_post = asyncio.create_task(client.post("/v1/completions", json=long_body))
            await asyncio.wait_for(seen.wait(), 20)
            short_post = asyncio.create_task(client.post("/v1/completions", json=short_body))
            await asyncio.sleep(0.1)
            exit_at = time.monotonic()
            s.server.request_exit()
            await asyncio.sleep(0.5)
            try:  # a new connection: refused once the listener closed (503 if it slipped in before)
                async with httpx.AsyncClient(base_url=s.url, timeout=5) as fresh:
                    new_outcome = (await fresh.post("/v1/completions", json=short_body)).status_code
            except httpx.TransportError as exc:
                new_outcome = type(exc).__name__
            results = await asyncio.gather(stream, long_post, short_post)
            return {"stream": results[0], "long": results[1], "short": results[2], "new": new_outcome,
                    "ended_after": time.monotonic() - exit_at}

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
    assert 1.0 <= out["ended_after"] < 1.0 + 3.0  # the timeout, then the abort went out at once
    assert engine.get_stats().num_blocks_free == engine.get_stats().num_blocks_total - 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_sigterm_drains_the_stream_in_flight_refuses_new_requests_and_exits_0(checkpoint: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    exe = shutil.which("vllm-jax")
    command = [exe] if exe else [sys.executable, "-m", "vllm_jax.cli"]
    command += ["serve", str(checkpoint), "--port", str(port), "--shutdown-timeout", "5", "--max-model-len", "256",
                "--block-size", "8", "--num-gpu-blocks-override", "40", "--max-num-seqs", "4",
                "--max-num-batched-tokens", "32", "--uvicorn-log-level", "warning"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
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
        signalled_at = None
        body = {"prompt": "drain", "max_tokens": 240, "stream": True, **LONG}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                payloads.append(line[len("data: "):])
                if signalled_at is None:
                    proc.send_signal(signal.SIGTERM)
                    signalled_at = time.monotonic()
                    time.sleep(0.5)  # the listener closes meanwhile
                    with pytest.raises(httpx.TransportError):  # new connections are refused
                        httpx.get(f"{url}/health", timeout=2)
                else:
                    events_after_signal += 1
        code = proc.wait(timeout=5 + 15)
        exited_after = time.monotonic() - signalled_at
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
        assert reason == "abort" and exited_after >= 5
    assert exited_after < 5 + 10
    print(f"\nSIGTERM drain: finish_reason {reason}, {events_after_signal} events after the signal, "
          f"exit 0 after {exited_after:.1f} s")
    assert "Traceback" not in "".join(log), "".join(log)

"""Load soak and overload against a real server (uvicorn on 127.0.0.1, a tiny random Llama, a KV cache small enough
to preempt): 200 requests at concurrency 32 — completions and chat, streaming and not, greedy and sampled, n=2,
stop strings, logprobs — with about 20% of the clients leaving at random points. Afterwards every request that
was not cancelled has a well-formed body and a finish_reason of stop or length, nothing runs or waits, no KV
block is held, and no XLA program was compiled after warm-up. Bounded: ~25 s on 2 CPU cores (warm-up included),
hard limit 150 s. VLLM_JAX_SOAK_REQUESTS=2000 runs a longer soak of the same mix.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from tests.helpers.http_checks import metric, openai_error, wait_idle_metrics
from tests.helpers.live_server import LETTERS, MODEL, Served, serve, tiny_checkpoint, tiny_engine_args
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.metrics.prometheus import PrometheusStatLogger

NUM_REQUESTS = int(os.environ.get("VLLM_JAX_SOAK_REQUESTS", "200"))  # raise it for a longer run by hand
CONCURRENCY = 32
DISCONNECT_FRACTION = 0.2
MAX_MODEL_LEN = 128
NUM_BLOCKS = 48  # 47 usable blocks of 8 tokens for up to 16 requests of up to ~100 tokens: preemption happens
SOAK_LIMIT_S = max(150.0, NUM_REQUESTS * 0.75)
PROFILES = ("greedy", "sampled", "n2", "stop", "logprobs")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    path = tiny_checkpoint(tmp_path_factory.mktemp("soak"))
    args = tiny_engine_args(path, max_model_len=MAX_MODEL_LEN, num_gpu_blocks_override=NUM_BLOCKS, max_num_seqs=16,
                            max_num_batched_tokens=64)
    metrics = PrometheusStatLogger(MODEL)
    s = serve(AsyncLLM.from_engine_args(args, stat_loggers=[metrics]), metrics=metrics)
    yield s
    s.stop()
    assert not s.thread.is_alive(), "the server did not stop"


# ---- the workload ---------------------------------------------------------------------------------------------

@dataclass
class Spec:
    index: int
    route: str  # "completions" or "chat"
    stream: bool
    profile: str
    body: dict
    n: int
    max_tokens: int
    leave_after_events: int | None = None  # streaming clients that leave: after this many SSE events
    leave_after_s: float | None = None  # non-streaming clients that leave: after this many seconds


@dataclass
class Outcome:
    spec: Spec
    kind: str  # "completed" or "disconnected"
    problems: list[str] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)


def _prompt(rng: random.Random) -> str:
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 7)))
             for _ in range(rng.randint(1, 8))]
    return " ".join(words)[:48] or "a"


def make_specs(seed: int = 0) -> list[Spec]:
    rng = random.Random(seed)
    leavers = set(rng.sample(range(NUM_REQUESTS), int(NUM_REQUESTS * DISCONNECT_FRACTION)))
    specs = []
    for i in range(NUM_REQUESTS):
        route = "chat" if i % 2 else "completions"
        stream = rng.random() < 0.5
        profile = PROFILES[(i // 2) % len(PROFILES)]
        leaver = i in leavers
        max_tokens = rng.randint(24 if leaver else 1, 48)  # a leaver runs long enough to be left mid-way
        body: dict = {"model": MODEL, "max_tokens": max_tokens, "stream": stream}
        n = 1
        if profile == "greedy":
            body["temperature"] = 0
        elif profile == "sampled":
            body.update(temperature=0.9, top_p=0.9, top_k=40, seed=rng.randrange(1 << 30))
        elif profile == "n2":
            n = 2
            body.update(n=2, temperature=1.0, seed=rng.randrange(1 << 30))
        elif profile == "stop":  # letters only, so "x" turns up and ends most of these with finish_reason stop
            body.update(temperature=1.0, seed=rng.randrange(1 << 30), stop=["x"], allowed_token_ids=LETTERS,
                        ignore_eos=True)
        elif profile == "logprobs":
            body["temperature"] = 0
            body.update({"logprobs": 2} if route == "completions" else {"logprobs": True, "top_logprobs": 2})
        prompt = _prompt(rng)
        if route == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        spec = Spec(i, route, stream, profile, body, n, max_tokens)
        if leaver:
            if stream:
                spec.leave_after_events = rng.randint(0, 8)
            else:
                spec.leave_after_s = rng.uniform(0.02, 0.5)
        specs.append(spec)
    return specs


# ---- checking a response --------------------------------------------------------------------------------------

def _check_final_reasons(spec: Spec, reasons: dict[int, str | None], texts: dict[int, str], out: Outcome) -> None:
    if sorted(reasons) != list(range(spec.n)):
        out.problems.append(f"choice indices {sorted(reasons)} for n={spec.n}")
    for index, reason in reasons.items():
        if reason not in ("stop", "length"):
            out.problems.append(f"choice {index}: finish_reason {reason!r}")
        out.finish_reasons.append(str(reason))
        if spec.profile == "stop" and "x" in texts.get(index, ""):
            out.problems.append(f"choice {index}: the stop string is in the text {texts[index]!r}")


def check_body(spec: Spec, body: dict, out: Outcome) -> None:
    """A non-streaming response: OpenAI's shape, n choices, a final finish_reason each, usage within bounds."""
    expected = "text_completion" if spec.route == "completions" else "chat.completion"
    if body.get("object") != expected or not str(body.get("id", "")):
        out.problems.append(f"object {body.get('object')!r}, id {body.get('id')!r}")
    reasons, texts = {}, {}
    for choice in body.get("choices", []):
        index = choice["index"]
        reasons[index] = choice.get("finish_reason")
        if spec.route == "completions":
            texts[index] = choice["text"]
            if spec.profile == "logprobs":
                lp = choice.get("logprobs") or {}
                if not (len(lp.get("tokens", [])) == len(lp.get("token_logprobs", [])) >= 1):
                    out.problems.append(f"choice {index}: logprobs {lp}")
        else:
            message = choice.get("message") or {}
            texts[index] = message.get("content") or ""
            if message.get("role") != "assistant":
                out.problems.append(f"choice {index}: role {message.get('role')!r}")
            if spec.profile == "logprobs" and not (choice.get("logprobs") or {}).get("content"):
                out.problems.append(f"choice {index}: no logprobs content")
    _check_final_reasons(spec, reasons, texts, out)
    usage = body.get("usage") or {}
    if not (usage.get("prompt_tokens", 0) >= 1 and 1 <= usage.get("completion_tokens", 0) <= spec.n * spec.max_tokens
            and usage.get("total_tokens") == usage["prompt_tokens"] + usage["completion_tokens"]):
        out.problems.append(f"usage {usage}")


def check_stream(spec: Spec, payloads: list[str], out: Outcome) -> None:
    """A whole SSE stream: JSON chunks of one id, no error event, every choice finished, then [DONE]."""
    if not payloads or payloads[-1] != "[DONE]" or payloads.count("[DONE]") != 1:
        out.problems.append(f"stream does not end with one [DONE]: {payloads[-2:]}")
        return
    expected = "text_completion" if spec.route == "completions" else "chat.completion.chunk"
    reasons: dict[int, str | None] = {}
    texts: dict[int, str] = {}
    ids = set()
    for payload in payloads[:-1]:
        chunk = json.loads(payload)
        if "error" in chunk or chunk.get("object") != expected:
            out.problems.append(f"bad chunk {payload[:200]}")
            return
        ids.add(chunk["id"])
        for choice in chunk["choices"]:
            index = choice["index"]
            piece = choice["text"] if spec.route == "completions" else (choice["delta"].get("content") or "")
            texts[index] = texts.get(index, "") + piece
            if choice.get("finish_reason") is not None:
                if index in reasons:
                    out.problems.append(f"choice {index} finished twice")
                reasons[index] = choice["finish_reason"]
    if len(ids) != 1:
        out.problems.append(f"chunk ids {ids}")
    _check_final_reasons(spec, reasons, texts, out)


# ---- the clients ------------------------------------------------------------------------------------------------

async def run_one(client: httpx.AsyncClient, spec: Spec) -> Outcome:
    path = f"/v1/{'chat/completions' if spec.route == 'chat' else 'completions'}"
    if spec.stream:
        payloads: list[str] = []
        async with client.stream("POST", path, json=spec.body) as resp:
            if resp.status_code != 200:
                return Outcome(spec, "completed", [f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"])
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payloads.append(line[len("data: "):])
                if spec.leave_after_events is not None and len(payloads) > spec.leave_after_events \
                        and payloads[-1] != "[DONE]":
                    return Outcome(spec, "disconnected")  # leaving the block closes the connection mid-stream
        out = Outcome(spec, "completed")
        check_stream(spec, payloads, out)
        return out
    request = client.post(path, json=spec.body)
    try:
        if spec.leave_after_s is not None:
            resp = await asyncio.wait_for(request, spec.leave_after_s)
        else:
            resp = await request
    except TimeoutError:
        return Outcome(spec, "disconnected")  # the cancelled request closed its connection
    out = Outcome(spec, "completed")
    if resp.status_code != 200:
        out.problems.append(f"HTTP {resp.status_code}: {resp.text[:300]}")
    else:
        check_body(spec, resp.json(), out)
    return out


async def run_soak(url: str, specs: list[Spec]) -> list[Outcome]:
    limit = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=2 * CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60, connect=10), limits=limits) as client:

        async def bounded(spec: Spec) -> Outcome:
            async with limit:
                return await run_one(client, spec)

        return await asyncio.gather(*(bounded(s) for s in specs))


# ---- the tests --------------------------------------------------------------------------------------------------

def test_soak_200_mixed_requests_with_disconnects_leaves_nothing_behind(
        served: Served, record_property: Callable[[str, object], None]) -> None:
    engine = served.engine
    compilations = engine.num_compilations
    assert compilations > 0  # warm-up compiled the step programs
    before = httpx.get(f"{served.url}/metrics", timeout=10).text
    specs = make_specs()
    started = time.monotonic()
    outcomes = asyncio.run(asyncio.wait_for(run_soak(served.url, specs), SOAK_LIMIT_S))
    elapsed = time.monotonic() - started

    problems = [f"#{o.spec.index} {o.spec.route} stream={o.spec.stream} {o.spec.profile}: {p}"
                for o in outcomes for p in o.problems]
    assert problems == [], "\n".join(problems[:20])
    kinds = Counter(o.kind for o in outcomes)
    assert kinds["completed"] + kinds["disconnected"] == NUM_REQUESTS
    assert kinds["disconnected"] >= NUM_REQUESTS * DISCONNECT_FRACTION / 2  # most leavers left before their end
    reasons = Counter(r for o in outcomes for r in o.finish_reasons)
    assert reasons["stop"] > 0 and reasons["length"] > 0

    text = wait_idle_metrics(served.url)
    assert metric(text, "vllm:num_requests_running") == 0
    assert metric(text, "vllm:num_requests_waiting") == 0
    assert metric(text, "vllm:kv_cache_usage_perc") == 0
    stats = engine.get_stats()
    assert stats.num_requests_running == stats.num_requests_waiting == 0
    assert stats.num_blocks_free == stats.num_blocks_total - 1, "KV blocks leaked"
    assert engine.num_compilations == compilations, "the engine compiled after warm-up"
    assert not engine.dead and engine.ready

    finished = {r: metric(text, "vllm:request_success_total", finished_reason=r)
                - metric(before, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length", "abort")}
    # every completion ended exactly once (the counter counts each of n completions, as vLLM's does); a client
    # that gave up on a non-streaming request before the server submitted it (a loaded machine) leaves no count
    served_n = sum(o.spec.n for o in outcomes if o.kind == "completed")
    assert served_n <= sum(finished.values()) <= sum(s.n for s in specs)
    # clients that left had their requests aborted in the engine (unless those had just finished anyway)
    assert 0 < finished["abort"] <= sum(o.spec.n for o in outcomes if o.kind == "disconnected")
    preemptions = metric(text, "vllm:num_preemptions_total") - metric(before, "vllm:num_preemptions_total")
    assert preemptions > 0, "the KV cache never ran out: the soak did not exercise preemption"
    figures = dict(requests=NUM_REQUESTS, completed=kinds["completed"], disconnected=kinds["disconnected"],
                   aborted_in_engine=int(finished["abort"]), finish_stop=reasons["stop"],
                   finish_length=reasons["length"], preemptions=int(preemptions),
                   blocks_leaked=stats.num_blocks_total - 1 - stats.num_blocks_free,
                   compilations_after_warmup=engine.num_compilations - compilations, seconds=round(elapsed, 1))
    for key, value in figures.items():
        record_property(key, value)
    print(f"\nsoak figures: {figures}")


class StalledStep:
    """fault_hook: the engine thread stalls inside its next step until `release` is set (nothing is scheduled
    meanwhile); `returned` counts the steps that got past it."""

    def __init__(self) -> None:
        self.release, self.returned = threading.Event(), 0

    def __call__(self) -> None:
        self.release.wait(60)  # a deadline that only stops a hang
        self.returned += 1


def test_requests_beyond_max_num_queued_requests_get_503_at_once(served: Served) -> None:
    """The refusals are answered while the engine is stalled and the queue still full: they never wait for room."""
    engine = served.engine
    stall = StalledStep()
    engine.max_num_queued_requests = 2
    engine.fault_hook = stall
    body = {"model": MODEL, "prompt": "queued", "max_tokens": 4, "temperature": 0}

    async def scenario() -> tuple[list[httpx.Response], list[httpx.Response], int]:
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
            queued = [asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(2)]
            deadline = time.monotonic() + 10
            while engine.get_stats().num_requests_waiting < 2:
                assert time.monotonic() < deadline, "the two requests never queued"
                await asyncio.sleep(0.02)
            refused = [await client.post("/v1/completions", json={**body, **extra}) for extra in ({}, {"stream": True})]
            refused.append(await client.post("/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
            steps_while_refusing = stall.returned
            stall.release.set()
            return list(await asyncio.gather(*queued)), refused, steps_while_refusing

    try:
        served_ok, refused, steps_while_refusing = asyncio.run(asyncio.wait_for(scenario(), 90))
    finally:
        stall.release.set()
        engine.fault_hook = None
        engine.max_num_queued_requests = None
    assert steps_while_refusing == 0  # every refusal came back before the stalled engine took a single step
    for resp in refused:
        err = openai_error(resp, 503)
        assert err["code"] == "queue_full" and err["type"] == "service_unavailable_error"
        assert "max_num_queued_requests" in err["message"]
    for resp in served_ok:
        assert resp.status_code == 200 and resp.json()["choices"][0]["finish_reason"] == "length"
    text = wait_idle_metrics(served.url)
    assert metric(text, "vllm:num_requests_waiting") == 0 and metric(text, "vllm:kv_cache_usage_perc") == 0


"""Mixed-traffic soak (issue #37 item 5, docs/reliability.md, "Mixed-traffic soak"): one served engine with every
feature it combines — two LoRA adapters, n-gram speculation, hermes tool calling (tool_choice "required"),
json_schema structured outputs, n=2, logprobs, the Responses API with its store — takes three bursts of 40
concurrent requests, with the engine put to sleep and woken after the first burst and its weights replaced after
the second (the dev routes). 10% of each burst is malformed (each must be a 4xx naming its field), 20% are
streaming clients that hang up mid-stream. Every request sent is accounted for; every kept one ends with a proper
finish reason; every stopped JSON output and every required tool call parses; nothing answers 5xx; afterwards
/metrics shows nothing running or waiting and no KV in use. Bounded: ~1-2 min on 2 CPU cores, hard limit 240 s.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch
from peft import LoraConfig, get_peft_model

from tests.helpers.http_checks import error_body, metric, wait_idle_metrics
from tests.helpers.live_server import MODEL, Served, serve, tiny_engine_args
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.metrics.prometheus import PrometheusStatLogger

BURSTS = int(os.environ.get("VLLM_JAX_MIXED_SOAK_BURSTS", "3"))  # raise it for a longer run by hand
PER_BURST = 40
CONCURRENCY = 16
SOAK_LIMIT_S = max(240.0, BURSTS * 40.0)
ADAPTERS = ("A", "B")
MODELS = (MODEL, *ADAPTERS)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
CLOSE_FIRST = {str(3 + ord(c)): 20 for c in "}]"}  # tests/helpers/tiny_models.py: byte b is token 3 + b
SCHEMA = {"type": "object", "properties": {"a": {"enum": [1, 2]}}, "required": ["a"], "additionalProperties": False}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
         "disable_by_batch_size": 64}  # the CPU default (4) would switch proposals off in these batches
# (kind, how many per burst of 40): 10% malformed, 20% streaming clients that hang up
MIX = (("malformed", 4), ("hangup", 8), ("tools", 5), ("json", 5), ("n2_logprobs", 5), ("adapter", 6),
       ("responses", 4), ("stream_structured", 3))
# a bad body (merged into a valid chat request unless the path says otherwise) and the field its 4xx must name
MALFORMED = (
    ("/v1/chat/completions", {"max_tokens": -1}, "max_tokens"),
    ("/v1/chat/completions", {"temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"n": 0}, "n"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ("/v1/chat/completions", {"model": "C"}, "model"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 99}, "logprobs"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": -1}, "max_output_tokens"),
)


@dataclass
class Spec:
    index: int
    kind: str
    path: str
    body: dict
    stream: bool = False
    leave_after_events: int | None = None
    field: str | None = None  # malformed: the field the 4xx must name


@dataclass
class Outcome:
    spec: Spec
    kind: str  # "completed", "disconnected" or "rejected"
    problems: list[str] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    status: int = 200


def _adapter(base: torch.nn.Module, path: Path, seed: int, r: int, targets: list[str]) -> None:
    torch.manual_seed(seed)
    get_peft_model(copy.deepcopy(base), LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets,
                                                   init_lora_weights=False)).save_pretrained(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Path]]:
    root = tmp_path_factory.mktemp("mixed_soak")
    base = make_tiny_checkpoint("llama", root / "a", seed=1)
    make_tiny_checkpoint("llama", root / "b", seed=2)  # the weights the update loads between bursts
    _adapter(base, root / "A", 1, 4, ["q_proj", "v_proj", "down_proj"])
    _adapter(base, root / "B", 2, 8, ["k_proj", "o_proj", "up_proj"])
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_SERVER_DEV_MODE", "1")
    args = tiny_engine_args(root / "a", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32,
                            num_gpu_blocks_override=64, enable_lora=True, max_loras=2, max_lora_rank=8,
                            lora_modules=[f"{n}={root / n}" for n in ADAPTERS], speculative_config=NGRAM,
                            enable_sleep_mode=True, structured_outputs_config={"disable_any_whitespace": True})
    metrics = PrometheusStatLogger(MODEL, num_speculative_tokens=NGRAM["num_speculative_tokens"])
    s = serve(AsyncLLM.from_engine_args(args, stat_loggers=[metrics]), metrics=metrics,
              enable_auto_tool_choice=True, tool_call_parser="hermes", responses_store_size=64)
    yield s, root
    s.stop()
    mp.undo()


# ---- the workload ---------------------------------------------------------------------------------------------

def _words(rng: random.Random) -> str:
    return " ".join("".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 5)))
                    for _ in range(rng.randint(1, 6)))


def make_specs(burst: int) -> list[Spec]:
    rng = random.Random(burst)
    kinds = [kind for kind, count in MIX for _ in range(count)]
    rng.shuffle(kinds)
    specs = []
    for i, kind in enumerate(kinds):
        model = MODELS[(i + burst) % len(MODELS)]
        chat = {"model": model, "messages": [{"role": "user", "content": _words(rng)}], "max_tokens": 12,
                "temperature": 0.8, "seed": rng.randrange(1 << 30)}
        spec = Spec(burst * PER_BURST + i, kind, "/v1/chat/completions", chat)
        if kind == "malformed":
            path, bad, spec.field = MALFORMED[(i + burst) % len(MALFORMED)]
            spec.path = path
            if path != "/v1/chat/completions":
                spec.body = {"model": MODEL}
            spec.body = {**spec.body, **bad}
        elif kind in ("hangup", "stream_structured"):
            spec.stream = True
            spec.body.update(stream=True, max_tokens=24)
            if kind == "hangup":  # chat, completions with n=2 and Responses streams, left after a few events
                spec.leave_after_events = rng.randint(1, 4)
                if i % 3 == 1:
                    spec.path = "/v1/completions"
                    spec.body = {k: v for k, v in spec.body.items() if k != "messages"} | {"prompt": _words(rng),
                                                                                          "n": 2}
                elif i % 3 == 2:
                    spec.path = "/v1/responses"
                    spec.body = {"model": model, "input": _words(rng), "max_output_tokens": 24, "stream": True}
            elif i % 2:  # streamed structured outputs: a required tool call or a JSON object, kept to the end
                spec.body.update(tools=[TOOL], tool_choice="required", max_tokens=48, logit_bias=CLOSE_FIRST)
            else:
                spec.body["response_format"] = JSON_FORMAT
        elif kind == "tools":
            spec.body.update(tools=[TOOL], tool_choice="required", max_tokens=48, logit_bias=CLOSE_FIRST)
        elif kind == "json":
            spec.body.update(max_tokens=24, response_format=JSON_FORMAT)
        elif kind == "n2_logprobs":
            spec.path = "/v1/completions"
            spec.body = {"model": model, "prompt": _words(rng), "n": 2, "logprobs": 2, "max_tokens": 16,
                         "temperature": 1.0, "seed": rng.randrange(1 << 30)}
        elif kind == "adapter":
            spec.body.update(model=ADAPTERS[i % 2], logprobs=True, top_logprobs=2, temperature=0)
        elif kind == "responses":
            spec.path = "/v1/responses"
            spec.body = {"model": model, "input": _words(rng), "max_output_tokens": 12, "store": True,
                         "temperature": 0.7}
        specs.append(spec)
    return specs


# ---- checking a response --------------------------------------------------------------------------------------

def check_structured(spec: Spec, reason: str | None, content: str | None, calls: list[dict], out: Outcome) -> None:
    """A required tool call that finished names the tool with arguments that parse; a JSON output that stopped
    parses and follows the schema."""
    if "tools" in spec.body and reason == "tool_calls":
        if not calls:
            out.problems.append("finish_reason tool_calls without calls")
        for call in calls:
            try:
                ok = call["function"]["name"] == "f" and isinstance(json.loads(call["function"]["arguments"]), dict)
            except (KeyError, TypeError, json.JSONDecodeError):
                ok = False
            if not ok:
                out.problems.append(f"tool call does not parse: {call}")
    if "response_format" in spec.body and reason == "stop":
        try:
            if json.loads(content or "")["a"] not in (1, 2):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            out.problems.append(f"JSON output does not parse: {content!r}")


def check_chat_or_completion(spec: Spec, body: dict, out: Outcome) -> None:
    n = spec.body.get("n", 1)
    choices = body.get("choices") or []
    if sorted(c["index"] for c in choices) != list(range(n)):
        out.problems.append(f"choice indices for n={n}: {[c['index'] for c in choices]}")
    for choice in choices:
        reason = choice.get("finish_reason")
        out.finish_reasons.append(str(reason))
        allowed = ("tool_calls", "length") if "tools" in spec.body else ("stop", "length")
        if reason not in allowed:
            out.problems.append(f"finish_reason {reason!r}")
        if spec.path == "/v1/completions":
            lp = choice.get("logprobs") or {}
            if spec.body.get("logprobs") and not (len(lp.get("tokens", [])) == len(lp.get("top_logprobs", [])) >= 1):
                out.problems.append(f"logprobs {lp}")
            continue
        message = choice.get("message") or {}
        check_structured(spec, reason, message.get("content"), message.get("tool_calls") or [], out)
        if spec.body.get("logprobs") and not (choice.get("logprobs") or {}).get("content"):
            out.problems.append("no logprobs content")


def check_response(spec: Spec, body: dict, out: Outcome) -> None:
    """A Responses API object: completed, or incomplete for max_output_tokens; stored, so GET finds it."""
    status = body.get("status")
    reason = (body.get("incomplete_details") or {}).get("reason")
    out.finish_reasons.append("stop" if status == "completed" else str(reason))
    if body.get("object") != "response" or (status, reason) not in (("completed", None),
                                                                     ("incomplete", "max_output_tokens")):
        out.problems.append(f"response {body.get('object')!r} {status!r} {reason!r}")


def check_stream(spec: Spec, payloads: list[str], out: Outcome) -> None:
    """A whole chat or completions stream: no error event, a finish reason per choice, then [DONE]; its content
    and tool call deltas put together must parse as the non-streamed ones do. A Responses stream ends with one
    terminal event instead."""
    if spec.path == "/v1/responses":
        terminal = json.loads(payloads[-1]) if payloads else {}
        if terminal.get("type") not in ("response.completed", "response.incomplete"):
            out.problems.append(f"Responses stream ends with {payloads[-1:]}")
        else:
            check_response(spec, terminal["response"], out)
        return
    if not payloads or payloads[-1] != "[DONE]" or payloads.count("[DONE]") != 1:
        out.problems.append(f"stream does not end with one [DONE]: {payloads[-2:]}")
        return
    reasons, content, calls = [], "", {}
    for payload in payloads[:-1]:
        chunk = json.loads(payload)
        if "error" in chunk:
            out.problems.append(f"error event {payload[:200]}")
            return
        for choice in chunk["choices"]:
            if choice.get("finish_reason") is not None:
                reasons.append(choice["finish_reason"])
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            for piece in delta.get("tool_calls") or []:
                call = calls.setdefault(piece["index"], {"function": {"name": "", "arguments": ""}})
                function = piece.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
    out.finish_reasons += reasons
    allowed = ("tool_calls", "length") if "tools" in spec.body else ("stop", "length")
    if len(reasons) != spec.body.get("n", 1) or any(r not in allowed for r in reasons):
        out.problems.append(f"finish reasons {reasons}")
        return
    check_structured(spec, reasons[0], content, list(calls.values()), out)


def check_rejection(spec: Spec, resp: httpx.Response, out: Outcome) -> None:
    out.kind, out.status = "rejected", resp.status_code
    if not 400 <= resp.status_code < 500:
        out.problems.append(f"HTTP {resp.status_code} for a bad {spec.field}: {resp.text[:200]}")
        return
    err = error_body(resp.json())
    if err["param"] != spec.field and spec.field not in err["message"]:
        out.problems.append(f"the {resp.status_code} does not name {spec.field}: {err}")


# ---- the clients ------------------------------------------------------------------------------------------------

async def run_one(client: httpx.AsyncClient, spec: Spec) -> Outcome:
    out = Outcome(spec, "completed")
    if spec.stream:
        payloads: list[str] = []
        async with client.stream("POST", spec.path, json=spec.body) as resp:
            if resp.status_code != 200:
                out.status = resp.status_code
                out.problems.append(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
                return out
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payloads.append(line[len("data: "):])
                if spec.leave_after_events is not None and len(payloads) >= spec.leave_after_events \
                        and payloads[-1] != "[DONE]":
                    out.kind = "disconnected"  # leaving the block closes the connection mid-stream
                    return out
        check_stream(spec, payloads, out)
        return out
    resp = await client.post(spec.path, json=spec.body)
    out.status = resp.status_code
    if spec.kind == "malformed":
        check_rejection(spec, resp, out)
    elif resp.status_code != 200:
        out.problems.append(f"HTTP {resp.status_code}: {resp.text[:300]}")
    elif spec.path == "/v1/responses":
        body = resp.json()
        check_response(spec, body, out)
        stored = await client.get(f"/v1/responses/{body['id']}")
        if stored.status_code != 200 or stored.json().get("id") != body["id"]:
            out.problems.append(f"stored response {body['id']}: HTTP {stored.status_code}")
    else:
        check_chat_or_completion(spec, resp.json(), out)
    return out


async def run_burst(url: str, specs: list[Spec]) -> list[Outcome]:
    limit = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120, connect=10)) as client:

        async def bounded(spec: Spec) -> Outcome:
            async with limit:
                return await run_one(client, spec)

        return await asyncio.gather(*(bounded(s) for s in specs))


def between_bursts(url: str, burst: int, root: Path) -> None:
    """After bursts 0, 3, ...: sleep (a generation request then gets the documented 503) and wake; after bursts 1,
    4, ...: new weights (b, then a again, ...). Both wait for the burst's aborted streams to drain first."""
    wait_idle_metrics(url)
    if burst % 3 == 0:
        assert httpx.post(f"{url}/sleep", params={"level": 1}, timeout=60).status_code == 200
        asleep = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert asleep.status_code == 503 and "sleeping" in asleep.json()["error"]["message"]
        assert httpx.post(f"{url}/wake_up", timeout=60).status_code == 200
        assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": False}
    elif burst % 3 == 1:
        weights = root / ("b" if burst % 2 else "a")
        resp = httpx.post(f"{url}/update_weights", json={"path": str(weights)}, timeout=120)
        assert resp.status_code == 200 and resp.json()["updated"] > 0, resp.text


# ---- the test ---------------------------------------------------------------------------------------------------

def test_mixed_soak_three_bursts_with_sleep_and_weight_update(
        served: tuple[Served, Path], record_property: Callable[[str, object], None]) -> None:
    server, root = served
    url = server.url
    outcomes: list[Outcome] = []
    specs: list[Spec] = []
    compilations = server.engine.num_compilations
    started = time.monotonic()
    for burst in range(BURSTS):
        burst_specs = make_specs(burst)
        specs += burst_specs
        remaining = SOAK_LIMIT_S - (time.monotonic() - started)
        outcomes += asyncio.run(asyncio.wait_for(run_burst(url, burst_specs), remaining))
        between_bursts(url, burst, root)
    elapsed = time.monotonic() - started

    problems = [f"#{o.spec.index} {o.spec.kind} {o.spec.path} {o.spec.body.get('model')}: {p}"
                for o in outcomes for p in o.problems]
    assert problems == [], "\n".join(problems[:20])
    assert sorted(o.spec.index for o in outcomes) == [s.index for s in specs], "a request was lost"
    assert not [o for o in outcomes if o.status >= 500], "a 5xx"
    kinds = Counter(o.kind for o in outcomes)
    assert kinds["rejected"] == sum(s.kind == "malformed" for s in specs)
    assert kinds["disconnected"] >= sum(s.kind == "hangup" for s in specs) // 2  # most left before their end
    reasons = Counter(r for o in outcomes for r in o.finish_reasons)
    tools = [o for o in outcomes if o.spec.kind == "tools"]
    assert sum("tool_calls" in o.finish_reasons for o in tools) >= len(tools) // 2, "few required calls finished"
    jsons = [o for o in outcomes if o.spec.kind == "json"]
    assert sum("stop" in o.finish_reasons for o in jsons) >= len(jsons) // 2, "few JSON outputs finished"

    text = wait_idle_metrics(url)
    assert metric(text, "vllm:num_requests_running") == 0
    assert metric(text, "vllm:num_requests_waiting") == 0
    assert metric(text, "vllm:kv_cache_usage_perc") == 0
    aborted = metric(text, "vllm:request_success_total", finished_reason="abort")
    assert aborted > 0, "no hang-up reached the engine as an abort"
    server.assert_idle()
    assert server.engine.num_compilations == compilations, "the engine compiled after warm-up"
    assert not server.engine.dead and server.engine.ready
    drafted = metric(text, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric(text, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafted > 0, "speculation never proposed"
    figures = dict(requests=len(specs), **{f"kind_{k}": n * BURSTS for k, n in MIX}, completed=kinds["completed"],
                   disconnected=kinds["disconnected"], aborted_in_engine=int(aborted),
                   rejected_4xx=kinds["rejected"], finish_stop=reasons["stop"], finish_length=reasons["length"],
                   finish_tool_calls=reasons["tool_calls"], draft_tokens=int(drafted),
                   accepted_tokens=int(accepted), seconds=round(elapsed, 1))
    for key, value in figures.items():
        record_property(key, value)
    print(f"\nmixed soak figures: {figures}")

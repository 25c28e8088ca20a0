"""The OpenAI-compatible server, end to end: a real uvicorn server on 127.0.0.1 (free port) serving a tiny random
Llama through the real AsyncLLM, driven by the official `openai` client and raw httpx.

The tiny model's text is random bytes, so content checks restrict sampling to the 26 letter tokens
(`allowed_token_ids`): every token is then one visible character and texts compare exactly.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.http_checks import metric
from tests.helpers.live_server import Served, serve, tiny_checkpoint, tiny_engine_args
from vllm_jax.cli import build_parser
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.metrics.prometheus import PrometheusStatLogger
from vllm_jax.server.chat_messages import ChatMessage, ContentPart, chat_conversation

API_KEY = "sk-test-key"
MODEL, ALIAS = "tiny-llama", "tiny-alias"
MAX_MODEL_LEN = 64
MAX_REQUEST_BYTES = 64 * 1024
LETTERS = list(range(259, 259 + 26))  # tests/helpers/tiny_models.py: 'a'..'z' are token ids 259..284
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _serve(engine: AsyncLLM, metrics: PrometheusStatLogger | None = None) -> Served:
    """Serve `engine` under two names, with an API key, `metrics` at /metrics; returns once it listens (not once
    it is ready)."""
    return serve(engine, model_names=[MODEL, ALIAS], api_key=API_KEY, max_request_bytes=MAX_REQUEST_BYTES,
                 wait_ready=False, metrics=metrics)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("server"))


@pytest.fixture(scope="module")
def served(checkpoint: Path) -> Iterator[Served]:
    metrics = PrometheusStatLogger(MODEL)
    s = _serve(AsyncLLM.from_engine_args(tiny_engine_args(checkpoint), stat_loggers=[metrics]), metrics)
    s.engine.wait_until_ready(timeout=300)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=60) as c:
        yield c


def _letters(**kw: object) -> dict:
    return {"allowed_token_ids": LETTERS, "ignore_eos": True, **kw}


def _error(resp: httpx.Response, status: int) -> dict:
    """The OpenAI error object of a response that must have `status`."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    return body["error"]


def _sse_events(lines: Iterator[str]) -> Iterator[str]:
    for line in lines:
        if line.startswith("data: "):
            yield line[len("data: "):]


def _wait_idle(served: Served, aborted: float | None = None, timeout: float = 10.0) -> str:
    """Poll /metrics until no request runs or waits, no KV block is held and (if given) the abort counter reached
    `aborted`; return the exposition. The gauges and the counters are published separately, so wait for both."""
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{served.url}/metrics", timeout=10).text
        busy = (metric(text, "vllm:num_requests_running") + metric(text, "vllm:num_requests_waiting")
                + metric(text, "vllm:kv_cache_usage_perc"))
        if (busy == 0 and (aborted is None or _aborted(text) >= aborted)) or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def _aborted(text: str) -> float:
    return metric(text, "vllm:request_success_total", finished_reason="abort")


# ---- discovery and tokens ----------------------------------------------------------------------------------

def test_models_lists_every_served_name_with_context_length(client: openai.OpenAI, http: httpx.Client) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL, ALIAS]
    assert http.get("/v1/models").json()["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert client.models.retrieve(ALIAS).id == ALIAS


def test_tokenize_then_detokenize_round_trips_text(http: httpx.Client) -> None:
    tok = http.post("/tokenize", json={"prompt": "hello world"}).json()
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] == MAX_MODEL_LEN
    assert http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"].endswith("hello world")
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    text = http.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert text == "user: hi\nassistant:"


def test_chat_conversation_keeps_each_messages_name_and_joins_text_parts() -> None:
    messages = [ChatMessage(role="user", content="hi", name="ann"),
                ChatMessage(role="assistant", content=[ContentPart(type="text", text="a"),
                                                       ContentPart(type="text", text="b")])]
    assert chat_conversation(messages) == [{"role": "user", "content": "hi", "name": "ann"},
                                           {"role": "assistant", "content": "a\nb"}]


NAMED_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}{% if m['name'] is defined %}({{ m['name'] }}){% endif %}"
                  ": {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def test_chat_completions_and_tokenize_render_the_same_named_conversation(
        served: Served, http: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(served.app.state.serving, "chat_template", NAMED_TEMPLATE)
    messages = [{"role": "user", "content": "hi", "name": "ann"}, {"role": "user", "content": "yo"}]
    tok = http.post("/tokenize", json={"messages": messages}).json()
    text = http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"]
    assert text == "user(ann): hi\nuser: yo\nassistant:"
    chat = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1, **_letters()}).json()
    assert chat["usage"]["prompt_tokens"] == tok["count"]


def test_version_and_health_answer_when_ready(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert http.get("/version").json()["version"]


# ---- completions ------------------------------------------------------------------------------------------------

def test_completion_usage_counts_prompt_and_generated_tokens(client: openai.OpenAI, http: httpx.Client) -> None:
    prompt_len = http.post("/tokenize", json={"prompt": "the sea"}).json()["count"]
    out = client.completions.create(model=MODEL, prompt="the sea", max_tokens=7, temperature=0,
                                    extra_body=_letters())
    assert out.id.startswith("cmpl-") and out.model == MODEL
    assert out.usage.prompt_tokens == prompt_len
    assert out.usage.completion_tokens == 7 == len(out.choices[0].text)
    assert out.usage.total_tokens == prompt_len + 7
    assert out.choices[0].finish_reason == "length"


def test_completion_stream_concatenates_to_the_non_stream_text(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL, prompt="once upon", max_tokens=10, temperature=0, extra_body=_letters())
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage == full.usage


def test_completion_stream_ends_with_done_over_raw_sse(http: httpx.Client) -> None:
    body = {"prompt": "abc", "max_tokens": 3, "stream": True, **_letters()}
    with http.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = list(_sse_events(resp.iter_lines()))
    assert events[-1] == "[DONE]"
    assert all(json.loads(e)["object"] == "text_completion" for e in events[:-1])


def test_prompt_list_with_n2_gives_indexed_choices_and_summed_usage(client: openai.OpenAI) -> None:
    prompts = [[1, 259, 260], [1, 261, 262, 263, 264]]
    out = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=4, temperature=1.0, seed=3,
                                    extra_body=_letters())
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.prompt_tokens == 3 + 5
    assert out.usage.completion_tokens == 4 * 4


def test_echo_prepends_the_prompt(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="xyz", echo=True, max_tokens=2, extra_body=_letters())
    assert out.choices[0].text.startswith("xyz") and len(out.choices[0].text) == 5


def test_stop_string_truncates_text_streamed_or_not(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL, prompt="stop here", temperature=0, extra_body=_letters())
    free = client.completions.create(max_tokens=16, **kw).choices[0].text
    stop = free[6:8]
    cut = free[:free.find(stop)]
    out = client.completions.create(max_tokens=16, stop=[stop], **kw).choices[0]
    assert (out.text, out.finish_reason) == (cut, "stop")
    assert out.model_extra["stop_reason"] == stop
    chunks = list(client.completions.create(max_tokens=16, stop=[stop], stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == cut


def test_completion_logprobs_align_with_tokens_and_offsets(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="hi", max_tokens=6, temperature=0, logprobs=3,
                                    extra_body=_letters())
    choice = out.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text and len(lp.tokens) == 6
    assert lp.text_offset == list(range(6))
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and top[token] == logprob and 3 <= len(top) <= 4


def test_prompt_logprobs_score_every_prompt_token_after_the_first(http: httpx.Client) -> None:
    prompt = [1, 259, 260, 261]
    choice = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 1}
                       ).json()["choices"][0]
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(prompt) and entries[0] is None
    for token, entry in zip(prompt[1:], entries[1:]):
        assert str(token) in entry and entry[str(token)]["logprob"] <= 0


def test_same_seed_reproduces_and_another_seed_differs(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        return client.completions.create(model=MODEL, prompt="dice", max_tokens=12, temperature=1.0, seed=seed,
                                         extra_body=_letters()).choices[0].text

    first = sample(1234)
    assert sample(1234) == first
    assert sample(4321) != first


# ---- chat ---------------------------------------------------------------------------------------------------

def test_chat_uses_the_template_and_counts_its_tokens(client: openai.OpenAI, http: httpx.Client) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    prompt_len = http.post("/tokenize", json={"messages": messages}).json()["count"]
    out = client.chat.completions.create(model=ALIAS, messages=messages, max_tokens=5, temperature=0,
                                         extra_body=_letters())
    assert out.id.startswith("chatcmpl-") and out.model == ALIAS
    assert out.choices[0].message.role == "assistant" and len(out.choices[0].message.content) == 5
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (prompt_len, 5)


def test_chat_stream_starts_with_the_role_and_matches_non_stream(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "count"}], max_tokens=8, temperature=0,
              extra_body=_letters())
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage == full.usage


def test_chat_n2_returns_two_completions_in_one_request(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "two"}], n=2, max_tokens=5, temperature=1.0,
              seed=11, extra_body=_letters())
    out = client.chat.completions.create(**kw)
    assert sorted(c.index for c in out.choices) == [0, 1]
    assert out.usage.completion_tokens == 10
    streamed: dict[int, str] = {0: "", 1: ""}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert streamed == {c.index: c.message.content for c in out.choices}


def test_chat_logprobs_give_sorted_top_alternatives(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                         temperature=0, logprobs=True, top_logprobs=2, extra_body=_letters())
    content = out.choices[0].logprobs.content
    assert "".join(t.token for t in content) == out.choices[0].message.content
    for t in content:
        assert t.bytes == list(t.token.encode()) and t.logprob <= 0
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob


# ---- errors -------------------------------------------------------------------------------------------------

def test_invalid_sampling_value_is_400_naming_the_param(http: httpx.Client) -> None:
    err = _error(http.post("/v1/completions", json={"prompt": "a", "temperature": -1}), 400)
    assert err["param"] == "temperature" and err["type"] == "invalid_request_error"
    err = _error(http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}],
                                                         "top_p": 0}), 400)
    assert err["param"] == "top_p"


def test_schema_violations_and_bad_json_are_400_not_422(http: httpx.Client) -> None:
    assert _error(http.post("/v1/completions", json={"prompt": "a", "n": "many"}), 400)["param"] == "n"
    assert _error(http.post("/v1/chat/completions", json={"messages": []}), 400)["param"] == "messages"
    assert _error(http.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "a"}]}),
                  400)["param"] == "messages"
    bad_json = http.post("/v1/completions", content=b'{"prompt": ', headers={"content-type": "application/json"})
    assert "JSON" in _error(bad_json, 400)["message"]


def test_prompt_longer_than_context_is_400_naming_both_lengths(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt=[5] * 100, max_tokens=4)
    message = exc.value.body["message"]
    assert str(MAX_MODEL_LEN) in message and "100" in message


def test_max_tokens_past_the_context_is_400(http: httpx.Client) -> None:
    err = _error(http.post("/v1/completions", json={"prompt": [5] * 10, "max_tokens": 60}), 400)
    assert err["param"] == "max_tokens" and "70" in err["message"]


def test_token_ids_outside_the_vocabulary_are_400(http: httpx.Client) -> None:
    assert _error(http.post("/v1/completions", json={"prompt": [1, 99999]}), 400)["param"] == "prompt"
    assert _error(http.post("/detokenize", json={"tokens": [-1]}), 400)["param"] == "tokens"


def test_missing_or_wrong_api_key_is_401_but_probes_stay_open(served: Served) -> None:
    url = served.url
    assert _error(httpx.post(f"{url}/v1/completions", json={"prompt": "a"}), 401)["code"] == "invalid_api_key"
    wrong = {"Authorization": "Bearer sk-wrong"}
    assert _error(httpx.get(f"{url}/v1/models", headers=wrong), 401)
    assert _error(httpx.post(f"{url}/tokenize", json={"prompt": "a"}), 401)
    for path in ("/health", "/metrics", "/version"):
        assert httpx.get(f"{url}{path}").status_code == 200, path


def test_tokenizer_info_is_served_only_when_enabled(http: httpx.Client) -> None:
    """vLLM registers /tokenizer_info only with --enable-tokenizer-info-endpoint (tests/engine/test_scoring.py has
    it)."""
    assert _error(http.get("/tokenizer_info"), 404)


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "a"}])
    assert exc.value.body["code"] == "model_not_found"


def test_body_over_max_request_bytes_is_413(http: httpx.Client) -> None:
    err = _error(http.post("/v1/completions", json={"prompt": "a" * (MAX_REQUEST_BYTES + 10)}), 413)
    assert str(MAX_REQUEST_BYTES) in err["message"]


def test_a_bad_request_does_not_disturb_a_stream_in_flight(client: openai.OpenAI, http: httpx.Client) -> None:
    kw = dict(model=MODEL, prompt="steady", max_tokens=20, temperature=0, extra_body=_letters())
    expected = client.completions.create(**kw).choices[0].text
    text = ""
    for i, chunk in enumerate(client.completions.create(stream=True, **kw)):
        if i == 2:
            _error(http.post("/v1/completions", json={"prompt": "a", "top_k": -7}), 400)
        text += chunk.choices[0].text
    assert text == expected


# ---- cancellation and metrics -------------------------------------------------------------------------------

@pytest.fixture
def slow_engine(served: Served) -> Iterator[None]:
    """Steps take >= 20 ms, so a 50-token request is still running when its client leaves."""
    served.engine.fault_hook = lambda: time.sleep(0.02)
    yield
    served.engine.fault_hook = None


def test_disconnect_mid_stream_aborts_and_frees_every_kv_block(served: Served, http: httpx.Client,
                                                              slow_engine: None) -> None:
    text = _wait_idle(served)
    before, generated = _aborted(text), metric(text, "vllm:generation_tokens_total")
    body = {"prompt": "a long one", "max_tokens": 50, "stream": True, **_letters()}
    with http.stream("POST", "/v1/completions", json=body) as resp:
        next(e for e in _sse_events(resp.iter_lines()) if json.loads(e)["choices"][0]["text"])
    text = _wait_idle(served, aborted=before + 1)
    assert metric(text, "vllm:num_requests_running") == 0
    assert metric(text, "vllm:kv_cache_usage_perc") == 0
    assert _aborted(text) == before + 1
    assert metric(text, "vllm:generation_tokens_total") - generated < 50  # it stopped early
    stats = served.engine.get_stats()
    assert stats.num_blocks_free == stats.num_blocks_total - 1


def test_non_streaming_client_timeout_aborts_the_request(served: Served, slow_engine: None) -> None:
    text = _wait_idle(served)
    before, generated = _aborted(text), metric(text, "vllm:generation_tokens_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{served.url}/v1/completions", headers=AUTH, timeout=0.5,
                   json={"prompt": "patience", "max_tokens": 50, **_letters()})
    text = _wait_idle(served, aborted=before + 1)
    assert _aborted(text) == before + 1
    assert metric(text, "vllm:generation_tokens_total") - generated < 50
    assert metric(text, "vllm:kv_cache_usage_perc") == 0


# ---- warm-up --------------------------------------------------------------------------------------------------

def test_health_and_generation_are_503_until_the_engine_is_ready(checkpoint: Path) -> None:
    release = threading.Event()

    def blocked_factory(config: object) -> object:
        release.wait(60)
        raise RuntimeError("start-up cancelled by the test")

    engine = AsyncLLM(tiny_engine_args(checkpoint).create_config(), engine_factory=blocked_factory)
    s = _serve(engine)
    try:
        assert _error(httpx.get(f"{s.url}/health"), 503)["code"] == "engine_not_ready"
        resp = httpx.post(f"{s.url}/v1/completions", headers=AUTH, json={"prompt": "a"})
        assert _error(resp, 503)["code"] == "engine_not_ready"
        assert httpx.get(f"{s.url}/metrics").status_code == 200
    finally:
        release.set()
        s.stop()


# ---- command line ---------------------------------------------------------------------------------------------

def test_serve_cli_takes_vllm_flag_names_and_documents_every_flag() -> None:
    parser = build_parser()
    ns = parser.parse_args(["serve", "some/model", "-tp", "2", "--served-model-name", "a", "b",
                            "--no-enable-prefix-caching", "--max-num-queued-requests", "4", "--max-model-len", "128"])
    assert (ns.model, ns.tensor_parallel_size, ns.served_model_name) == ("some/model", 2, ["a", "b"])
    assert (ns.enable_prefix_caching, ns.max_num_queued_requests, ns.max_model_len) == (False, 4, 128)
    assert (ns.host, ns.port, ns.api_key) == ("127.0.0.1", 8000, None)
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in ("serve", "generate"):
        undocumented = [a.option_strings or a.dest for a in subcommands[name]._actions if not a.help]
        assert undocumented == [], name


@pytest.mark.parametrize("flags", [[], ["--disable-log-stats", "--enable-tokenizer-info-endpoint"]])
def test_serve_gives_its_prometheus_logger_to_the_engine_and_serves_it_at_metrics(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str]) -> None:
    """`vllm-jax serve` wires one Prometheus logger into both the engine and /metrics, next to the log-line logger
    (neither with --disable-log-stats), with
    no `_created` series, as vLLM; /tokenizer_info exists only with its flag. The launcher is driven in-process
    and stopped before it listens: nothing here needs a running engine."""
    from fastapi.testclient import TestClient

    import vllm_jax.engine.async_llm as async_llm
    import vllm_jax.server.api_server as api_server
    import vllm_jax.server.launcher as launcher
    from vllm_jax.cli import main

    engines: list[dict] = []
    apps: list[tuple] = []
    build_app = api_server.build_app

    class RecordedAsyncLLM(AsyncLLM):
        def __init__(self, config, **kwargs):
            engines.append(kwargs)
            super().__init__(config, **kwargs)

    def recorded_build_app(*args, **kwargs):
        apps.append((build_app(*args, **kwargs), kwargs.get("metrics")))
        return apps[-1][0]

    def no_socket(host: str, port: int) -> None:
        raise OSError("the test does not listen")

    monkeypatch.setattr(async_llm, "AsyncLLM", RecordedAsyncLLM)
    monkeypatch.setattr(api_server, "build_app", recorded_build_app)
    monkeypatch.setattr(launcher, "bind_socket", no_socket)
    assert main(["serve", str(checkpoint), "--served-model-name", "named", *flags]) == 1
    (app, metrics), = apps
    loggers = list(engines[0]["stat_loggers"])
    if metrics is None:
        assert loggers == []
    else:  # and vLLM's periodic log line (metrics/logging_stats.py)
        assert loggers[0] is metrics and [type(x).__name__ for x in loggers[1:]] == ["LoggingStatLogger"]
    with TestClient(app) as client:
        text = client.get("/metrics").text
    routes = {getattr(route, "path", None) for route in app.routes}
    assert ("/tokenizer_info" in routes) == ("--enable-tokenizer-info-endpoint" in flags)
    if flags:
        assert metrics is None and text == ""
    else:
        assert isinstance(metrics, PrometheusStatLogger)
        assert 'vllm:num_requests_waiting{engine="0",model_name="named"}' in text
        assert "_created" not in text

"""Hand-written bad input against a real server (tiny model, max_model_len 64, default body limit): each request
gets a 4xx with OpenAI's error body naming the offending field and saying what is wrong, never a 500 and never
a crash, and the server serves a normal request right after each one. At the end no request is left running
and every KV block is free.

Limits chosen (protocol.py, middleware.py): n <= 128, <= 1024 prompts per request, <= 64 stop strings of <= 1024
characters (bad_words: <= 1024 of <= 1024 characters), logprobs / top_logprobs / prompt_logprobs <=
--max-logprobs (20), bodies <= --max-request-bytes (default 16 MiB).
"""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from starlette.testclient import TestClient

import vllm_jax.multimodal.chat_parts as chat_parts
from tests.helpers.http_checks import openai_error
from tests.helpers.live_server import MAX_MODEL_LEN, MODEL, Served, start_server, tiny_checkpoint
from tests.helpers.tiny_models import VOCAB_SIZE
from vllm_jax.server.api_server import build_app
from vllm_jax.server.middleware import DEFAULT_MAX_REQUEST_BYTES
from vllm_jax.server.protocol import MAX_BAD_WORDS, MAX_N, MAX_PROMPTS, MAX_STOP_CHARS, MAX_STOP_STRINGS
from vllm_jax.server.serving import THREADED_TOKENIZE_CHARS

USER = [{"role": "user", "content": "hi"}]
MAX_LOGPROBS = 20  # EngineArgs' default --max-logprobs


@dataclass(frozen=True)
class Bad:
    """One bad request: `body` is JSON-encoded unless it is bytes (sent as is, as JSON unless `content_type`)."""

    name: str
    path: str
    body: Any
    param: str | None  # the `param` the error must name (None: the body as a whole)
    says: str  # a fragment the message must contain
    status: int = 400
    content_type: str = "application/json"


def _chat(**fields: Any) -> dict[str, Any]:
    return {"messages": USER, **fields}


def _cmpl(**fields: Any) -> dict[str, Any]:
    return {"prompt": "hello", **fields}


def _png_url() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (2, 2), (9, 99, 199)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


_PNG_URL = _png_url()


def _image_chat(*urls: str) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, *parts]}]}


CASES = [
    # the body itself
    Bad("malformed JSON", "/v1/completions", b'{"prompt": "a",', None, "not valid JSON"),
    Bad("JSON array instead of an object", "/v1/completions", b"[1, 2]", None, "must be a JSON object"),
    Bad("JSON sent as text/plain", "/v1/completions", b'{"prompt": "a"}', None, "Content-Type: application/json",
        content_type="text/plain"),
    Bad("empty body", "/v1/chat/completions", b"", None, "missing"),
    Bad("invalid UTF-8 bytes", "/v1/completions", b'{"prompt": "caf\xe9 \xff"}', None, "not valid UTF-8"),
    Bad("invalid UTF-8 in a chat message", "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', None, "not valid UTF-8"),
    Bad("JSON nested 100000 deep", "/v1/completions", b'{"prompt": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000
        + b"}", None, "nested too deeply"),
    # wrong types (strict: no silent conversion)
    Bad("max_tokens as a string", "/v1/completions", _cmpl(max_tokens="ten"), "max_tokens", "valid integer"),
    Bad("max_tokens as a bool", "/v1/completions", _cmpl(max_tokens=True), "max_tokens", "valid integer"),
    Bad("max_tokens as a float", "/v1/completions", _cmpl(max_tokens=2.5), "max_tokens", "valid integer"),
    Bad("stream as a string", "/v1/chat/completions", _chat(stream="yes"), "stream", "valid boolean"),
    Bad("temperature as a string", "/v1/completions", _cmpl(temperature="hot"), "temperature", "valid number"),
    Bad("prompt as a number", "/v1/completions", {"prompt": 42}, "prompt", "must be a string"),
    Bad("prompt token ids as floats", "/v1/completions", {"prompt": [1.5, 2]}, "prompt", "token ids"),
    Bad("messages as a string", "/v1/chat/completions", {"messages": "hi"}, "messages", "valid list"),
    Bad("stop as a number", "/v1/completions", _cmpl(stop=7), "stop", "string or a list of strings"),
    Bad("logit_bias as a list", "/v1/completions", _cmpl(logit_bias=[1, 2]), "logit_bias", "valid dictionary"),
    # sizes and ranges
    Bad("max_tokens 10**12", "/v1/completions", _cmpl(max_tokens=10**12), "max_tokens", "2147483647"),
    Bad("max_completion_tokens 10**12", "/v1/chat/completions", _chat(max_completion_tokens=10**12),
        "max_completion_tokens", "2147483647"),
    Bad("max_tokens past the context", "/v1/completions", _cmpl(max_tokens=10**6), "max_tokens",
        f"maximum context length is {MAX_MODEL_LEN}"),
    Bad("max_tokens 0", "/v1/completions", _cmpl(max_tokens=0), "max_tokens", ">= 1"),
    Bad("max_tokens 0 without echo says echo allows it", "/v1/completions", _cmpl(max_tokens=0, logprobs=1),
        "max_tokens", "only with echo"),
    Bad("negative max_tokens with echo", "/v1/completions", _cmpl(max_tokens=-1, echo=True), "max_tokens", ">= 1"),
    Bad("negative max_tokens", "/v1/chat/completions", _chat(max_tokens=-5), "max_tokens", ">= 1"),
    Bad(f"n = {MAX_N + 1}", "/v1/completions", _cmpl(n=MAX_N + 1), "n", f"less than or equal to {MAX_N}"),
    Bad("n = 0", "/v1/chat/completions", _chat(n=0), "n", "greater than or equal to 1"),
    Bad("n = 10**30", "/v1/completions", _cmpl(n=10**30), "n", f"{MAX_N}"),
    Bad("negative temperature", "/v1/completions", _cmpl(temperature=-0.5), "temperature", ">= 0"),
    Bad("NaN temperature", "/v1/completions", b'{"prompt": "a", "temperature": NaN}', "temperature", "finite"),
    Bad("Infinity temperature", "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "a"}], "temperature": Infinity}', "temperature", "finite"),
    Bad("temperature 1e999 (overflows to inf)", "/v1/completions", b'{"prompt": "a", "temperature": 1e999}',
        "temperature", "finite"),
    Bad("NaN top_p", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a"}], "top_p": NaN}',
        "top_p", "finite"),
    Bad("NaN logit_bias value", "/v1/completions", b'{"prompt": "a", "logit_bias": {"5": NaN}}', "logit_bias",
        "finite"),
    Bad("presence_penalty 3", "/v1/completions", _cmpl(presence_penalty=3), "presence_penalty", "[-2, 2]"),
    Bad("top_p 0", "/v1/chat/completions", _chat(top_p=0), "top_p", "(0, 1]"),
    Bad("top_k 10**12", "/v1/completions", _cmpl(top_k=10**12), "top_k", "2147483647"),
    Bad("top_k -5", "/v1/completions", _cmpl(top_k=-5), "top_k", "-1"),
    Bad("min_tokens above max_tokens", "/v1/completions", _cmpl(min_tokens=5, max_tokens=2), "min_tokens",
        "max_tokens"),
    Bad("seed 10**30", "/v1/completions", _cmpl(seed=10**30), "seed", "less than or equal"),
    Bad("logprobs above --max-logprobs", "/v1/completions", _cmpl(logprobs=MAX_LOGPROBS + 1), "logprobs",
        "--max-logprobs"),
    Bad("top_logprobs above --max-logprobs", "/v1/chat/completions",
        _chat(logprobs=True, top_logprobs=MAX_LOGPROBS + 80), "top_logprobs", "--max-logprobs"),
    Bad("prompt_logprobs above --max-logprobs", "/v1/completions", _cmpl(prompt_logprobs=10**6), "prompt_logprobs",
        "--max-logprobs"),
    Bad("echo's logprobs above --max-logprobs", "/v1/completions", _cmpl(echo=True, logprobs=MAX_LOGPROBS + 1,
        max_tokens=0), "logprobs", "--max-logprobs"),
    Bad(f"{MAX_PROMPTS * 10} text prompts", "/v1/completions", {"prompt": ["a"] * (MAX_PROMPTS * 10)}, "prompt",
        f"at most {MAX_PROMPTS}"),
    Bad(f"{MAX_PROMPTS * 10} token-id prompts", "/v1/completions", {"prompt": [[1, 5]] * (MAX_PROMPTS * 10)},
        "prompt", f"at most {MAX_PROMPTS}"),
    Bad("a prompt longer than the context", "/v1/completions", {"prompt": [5] * 1000}, "prompt", "1000"),
    Bad("empty prompt list", "/v1/completions", {"prompt": []}, "prompt", "empty"),
    Bad("a 10**6-character stop string", "/v1/completions", _cmpl(stop="x" * 10**6), "stop",
        f"at most {MAX_STOP_CHARS} characters"),
    Bad(f"{MAX_STOP_STRINGS * 100} stop strings", "/v1/completions", _cmpl(stop=["x"] * (MAX_STOP_STRINGS * 100)),
        "stop", f"at most {MAX_STOP_STRINGS}"),
    Bad("an empty stop string", "/v1/completions", _cmpl(stop=[""]), "stop", "empty string"),
    Bad(f"{MAX_BAD_WORDS + 1} bad words", "/v1/completions", _cmpl(bad_words=["no"] * (MAX_BAD_WORDS + 1)),
        "bad_words", f"at most {MAX_BAD_WORDS}"),
    # chat messages
    Bad("empty messages", "/v1/chat/completions", {"messages": []}, "messages", "at least 1 item"),
    Bad("unknown role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "a"}]}, "messages",
        "'user'"),
    Bad("message without a role", "/v1/chat/completions", {"messages": [{"content": "a"}]}, "messages", "role"),
    Bad("message that is not an object", "/v1/chat/completions", {"messages": ["hi"]}, "messages",
        "valid dictionary"),
    # images (docs/serving.md, "Images"); the refusals a model that reads images would give are further down
    Bad("an image for a model without a vision tower", "/v1/chat/completions", _image_chat(_PNG_URL),
        "messages[0].content[1].image_url", f"model {MODEL} does not accept image inputs"),
    Bad("an input_image for a model without a vision tower", "/v1/responses",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": _PNG_URL}]}]}, "input",
        f"model {MODEL} does not accept image inputs"),
    Bad("an unknown content part type", "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x"}}]}]},
        "messages[0].content[0]", "content parts of type 'input_audio' are not supported"),
    Bad("an image_pil part over HTTP", "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_pil", "image_pil": "cat.png"}]}]},
        "messages[0].content[0]", "offline API"),
    Bad("continue_final_message after a user message", "/v1/chat/completions",
        _chat(continue_final_message=True, add_generation_prompt=False), "messages", "assistant"),
    Bad("chat_template_kwargs nested 900 deep", "/v1/chat/completions",
        _chat(chat_template_kwargs={"deep": json.loads("[" * 900 + "]" * 900)}), "chat_template_kwargs",
        "at most 64 levels"),
    Bad("/tokenize chat_template_kwargs nested 900 deep", "/tokenize",
        {"messages": USER, "chat_template_kwargs": {"d": json.loads("[" * 900 + "]" * 900)}},
        "chat_template_kwargs", "at most 64 levels"),
    # text that is not Unicode: JSON can spell lone surrogates, UTF-8 cannot encode them
    Bad("lone surrogate in the prompt", "/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt",
        "unpaired surrogates"),
    Bad("lone surrogate in a message", "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\\udc00"}]}', "messages", "unpaired surrogates"),
    Bad("lone surrogate in a stop string", "/v1/completions", b'{"prompt": "a", "stop": ["\\ud800"]}', "stop",
        "unpaired surrogates"),
    Bad("lone surrogate in bad_words", "/v1/completions", b'{"prompt": "a", "bad_words": ["\\ud800"]}',
        "bad_words", "unpaired surrogates"),
    Bad("lone surrogate in /tokenize", "/tokenize", b'{"prompt": "\\ud800"}', "prompt", "unpaired surrogates"),
    Bad("lone surrogate in the model name", "/v1/completions", b'{"prompt": "a", "model": "x\\ud800"}', "model",
        "does not exist", status=404),
    # token ids outside the vocabulary
    Bad("prompt id = vocab size", "/v1/completions", {"prompt": [1, VOCAB_SIZE]}, "prompt", "outside the vocabulary"),
    Bad("negative prompt id", "/v1/completions", {"prompt": [1, -1]}, "prompt", "outside the vocabulary"),
    Bad("prompt id 10**20 in a list of prompts", "/v1/completions", {"prompt": [[1, 2], [5, 10**20]]}, "prompt",
        "outside the vocabulary"),
    Bad("stop_token_ids outside the vocabulary", "/v1/completions", _cmpl(stop_token_ids=[VOCAB_SIZE]),
        "stop_token_ids", "outside the vocabulary"),
    Bad("negative stop_token_ids", "/v1/chat/completions", _chat(stop_token_ids=[-1]), "stop_token_ids",
        "non-negative"),
    Bad("logit_bias key outside the vocabulary", "/v1/completions", _cmpl(logit_bias={str(VOCAB_SIZE): 1}),
        "logit_bias", "outside the vocabulary"),
    Bad("logit_bias key 10**40", "/v1/chat/completions", _chat(logit_bias={str(10**40): 1}), "logit_bias",
        "outside the vocabulary"),
    Bad("negative logit_bias key", "/v1/completions", _cmpl(logit_bias={"-3": 1}), "logit_bias", "non-negative"),
    Bad("logit_bias key that is not a number", "/v1/completions", _cmpl(logit_bias={"abc": 1}), "logit_bias",
        "token ids"),
    Bad("allowed_token_ids outside the vocabulary", "/v1/completions", _cmpl(allowed_token_ids=[1, 999]),
        "allowed_token_ids", "outside the vocabulary"),
    Bad("allowed_token_ids 10**30", "/v1/chat/completions", _chat(allowed_token_ids=[10**30]), "allowed_token_ids",
        "outside the vocabulary"),
    Bad("empty allowed_token_ids", "/v1/completions", _cmpl(allowed_token_ids=[]), "allowed_token_ids", "empty"),
    Bad("/detokenize id outside the vocabulary", "/detokenize", {"tokens": [VOCAB_SIZE]}, "tokens",
        "outside the vocabulary"),
    # options that cannot be honored, and /tokenize's own rules
    Bad("best_of != n", "/v1/completions", _cmpl(best_of=3), "best_of", "not supported"),
    Bad("suffix", "/v1/completions", _cmpl(suffix="end"), "suffix", "not supported"),
    Bad("a tool without its function", "/v1/chat/completions", _chat(tools=[{"type": "function"}]), "tools",
        "tools.0.function"),
    Bad("tools without --enable-auto-tool-choice", "/v1/chat/completions",
        _chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tool_choice", "--enable-auto-tool-choice"),
    Bad("stream_options without stream", "/v1/completions", _cmpl(stream_options={"include_usage": True}),
        "stream_options", "stream"),
    Bad("prompt_logprobs in a stream, even with echo", "/v1/completions",
        _cmpl(stream=True, echo=True, logprobs=1, prompt_logprobs=1), "prompt_logprobs", "without stream"),
    Bad("empty cache_salt", "/v1/completions", _cmpl(cache_salt=""), "cache_salt", "at least 1 character"),
    Bad("/tokenize with prompt and messages", "/tokenize", {"prompt": "a", "messages": USER}, "prompt",
        "exactly one"),
    Bad("/tokenize with empty messages", "/tokenize", {"messages": []}, "messages", "empty"),
    Bad("unknown model", "/v1/chat/completions", _chat(model="gpt-4"), "model", "does not exist", status=404),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = start_server(tiny_checkpoint(tmp_path_factory.mktemp("bad_input")))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=120) as client:
        yield client


def _send(http: httpx.Client, path: str, body: Any, content_type: str = "application/json") -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post(path, content=data, headers={"Content-Type": content_type})


def _assert_still_serving(http: httpx.Client) -> None:
    resp = http.post("/v1/completions", json={"prompt": "still here", "max_tokens": 2, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_a_4xx_naming_the_field_and_the_server_keeps_serving(http: httpx.Client, case: Bad) -> None:
    err = openai_error(_send(http, case.path, case.body, case.content_type), case.status)
    assert err["param"] == case.param, err
    assert case.says in err["message"], err
    assert err["type"] == ("not_found_error" if case.status == 404 else "invalid_request_error")
    _assert_still_serving(http)


IMAGE_CASES = [  # as a model that reads images would answer them (first image at content[1])
    Bad("an undecodable image", "/v1/chat/completions", _image_chat("data:image/png;base64,aGVsbG8="),
        "messages[0].content[1].image_url", "cannot be decoded as an image"),
    Bad("an http URL while fetching is off", "/v1/chat/completions", _image_chat("https://example.com/cat.png"),
        "messages[0].content[1].image_url", "fetching http(s) URLs is off"),
    Bad("a file:// URL without --allowed-local-media-path", "/v1/chat/completions",
        _image_chat("file:///etc/hostname"), "messages[0].content[1].image_url", "file:// URLs are off"),
    Bad("more images than --limit-mm-per-prompt (vLLM's default 999)", "/v1/chat/completions",
        _image_chat(*[_PNG_URL] * 1000), "messages[0].content[1000].image_url", "at most 999 image(s)"),
]


@pytest.mark.parametrize("case", IMAGE_CASES, ids=[c.name for c in IMAGE_CASES])
def test_bad_images_get_a_400_naming_the_part_and_never_reach_the_engine(
        served: Served, http: httpx.Client, monkeypatch: pytest.MonkeyPatch, case: Bad) -> None:
    """The checks after "does the model read images" (the server runs in this process: the model is made to say
    yes), each before the engine is called at all."""
    monkeypatch.setattr(chat_parts, "model_accepts_images", lambda hf_config: True)
    calls = []
    generate = served.engine.generate
    monkeypatch.setattr(served.engine, "generate", lambda *a, **kw: calls.append(a) or generate(*a, **kw))
    err = openai_error(_send(http, case.path, case.body), case.status)
    assert (err["param"], calls) == (case.param, []), err
    assert case.says in err["message"], err
    _assert_still_serving(http)


def test_wrong_method_and_unknown_route_get_openai_bodies(http: httpx.Client) -> None:
    assert "Method Not Allowed" in openai_error(http.get("/v1/completions"), 405)["message"]
    assert "does not exist" in openai_error(http.post("/v1/images/generations", json={}), 404)["message"]
    _assert_still_serving(http)


def test_a_10_mb_body_without_a_configured_limit_is_read_and_refused_for_its_length(http: httpx.Client) -> None:
    body = json.dumps({"prompt": [5] * ((10 << 20) // 3 + 1000), "max_tokens": 1}).encode()
    assert 10 << 20 <= len(body) < DEFAULT_MAX_REQUEST_BYTES
    err = openai_error(_send(http, "/v1/completions", body), 400)
    assert err["param"] == "prompt" and f"maximum context length is {MAX_MODEL_LEN}" in err["message"]
    _assert_still_serving(http)


def test_a_body_over_the_default_16_mib_limit_is_413(http: httpx.Client) -> None:
    body = json.dumps({"prompt": "a" * DEFAULT_MAX_REQUEST_BYTES}).encode()
    err = openai_error(_send(http, "/v1/completions", body), 413)
    assert err["code"] == "request_too_large" and str(DEFAULT_MAX_REQUEST_BYTES) in err["message"]
    _assert_still_serving(http)


def test_max_request_bytes_flag_answers_a_10_mb_body_with_413(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    """`vllm-jax serve --max-request-bytes 1048576` builds an app that refuses 10 MB before parsing it (the app is
    taken from the launcher and driven in-process: the limit answers before any route, so no engine is needed)."""
    import vllm_jax.server.api_server as api_server
    import vllm_jax.server.launcher as launcher
    from vllm_jax.cli import main

    apps = []
    monkeypatch.setattr(api_server, "build_app", lambda *a, **kw: apps.append(build_app(*a, **kw)) or apps[-1])

    def no_socket(host: str, port: int) -> None:
        raise OSError("the test does not listen")

    monkeypatch.setattr(launcher, "bind_socket", no_socket)
    checkpoint = tiny_checkpoint(tmp_path)
    assert main(["serve", str(checkpoint), "--max-request-bytes", str(1 << 20)]) == 1
    with TestClient(apps[0]) as client:
        resp = client.post("/v1/completions", content=b'{"prompt": "' + b"a" * (10 << 20) + b'"}',
                           headers={"Content-Type": "application/json"})
        err = openai_error(httpx.Response(resp.status_code, content=resp.content), 413)
        assert "1048576" in err["message"] and "--max-request-bytes" in err["message"]
        assert client.get("/version").status_code == 200


class HeldEncode:
    """Stands in for the server's `tokenizer.encode`: a text long enough to be tokenized in a worker thread waits
    inside encode until the test lets it go, so the test knows that prompt is still being tokenized."""

    def __init__(self, encode: Callable[..., list[int]]):
        self.encode, self.entered, self.release = encode, threading.Event(), threading.Event()

    def __call__(self, text: str, *args: Any, **kwargs: Any) -> list[int]:
        if len(text) > THREADED_TOKENIZE_CHARS:
            self.entered.set()
            self.release.wait(120)  # a deadline that only stops a hang
        return self.encode(text, *args, **kwargs)


def test_a_megabytes_long_prompt_is_tokenized_without_stalling_other_requests(
        served: Served, http: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a 3 MB prompt is held inside the tokenizer, /health and a whole completion are served: its
    tokenization runs off the event loop (were it on the loop, nothing would answer until it was let go)."""
    held = HeldEncode(served.engine.tokenizer.encode)
    monkeypatch.setattr(served.engine.tokenizer, "encode", held)
    result: dict[str, httpx.Response] = {}
    worker = threading.Thread(target=lambda: result.setdefault(
        "resp", httpx.post(f"{served.url}/v1/completions", json={"prompt": "a" * (3 << 20)}, timeout=120)))
    worker.start()
    try:
        assert held.entered.wait(60), "the long prompt never reached the tokenizer"
        assert httpx.get(f"{served.url}/health", timeout=30).status_code == 200
        _assert_still_serving(http)
        assert worker.is_alive() and not held.release.is_set()  # all of it while the long prompt was held
    finally:
        held.release.set()
        worker.join(timeout=120)
    err = openai_error(result["resp"], 400)
    assert err["param"] == "prompt" and str(3 << 20) in err["message"]


@pytest.mark.parametrize("fields", [
    {"temperature": 1e308}, {"temperature": 1e-300}, {"repetition_penalty": 1e308},
    {"repetition_penalty": 1e-300}, {"logit_bias": {"5": 1e308}}, {"top_k": 2**31 - 1}, {"n": MAX_N},
    {"min_p": 1.0}, {"seed": -(2**63)}, {"priority": 2**63 - 1}, {"stop": ["x" * MAX_STOP_CHARS]},
    {"prompt": [[1, 5]] * 64}, {"x": json.loads("[" * 900 + "]" * 900)},
    {"chat_template_kwargs": {"deep": json.loads("[" * 60 + "]" * 60)}},
], ids=lambda f: ",".join(f))
def test_extreme_but_valid_values_are_served(http: httpx.Client, fields: dict[str, Any]) -> None:
    path = "/v1/chat/completions" if "chat_template_kwargs" in fields else "/v1/completions"
    body = {**(_chat() if "chat" in path else _cmpl()), "max_tokens": 2, **fields}
    resp = http.post(path, json=body)
    assert resp.status_code == 200, resp.text[:500]
    assert all(c["finish_reason"] in ("length", "stop") for c in resp.json()["choices"])


def test_after_all_the_bad_input_no_request_is_left_and_every_kv_block_is_free(served: Served,
                                                                              http: httpx.Client) -> None:
    served.assert_idle()
    assert served.thread.is_alive() and http.get("/health").status_code == 200
    assert http.get("/v1/models").json()["data"][0]["id"] == MODEL


def test_the_error_body_is_built_for_any_message_even_unencodable_ones() -> None:
    """The model name case above in isolation: a message with a lone surrogate still renders as UTF-8 JSON."""
    from vllm_jax.server.errors import APIError, error_response

    resp = error_response(APIError(404, "The model `x\ud800` does not exist.", param="model"))
    assert json.loads(resp.body)["error"]["message"] == "The model `x\\ud800` does not exist."


def test_a_request_during_shutdown_is_told_the_server_is_shutting_down_not_warming_up():
    from types import SimpleNamespace

    from vllm_jax.server.errors import APIError
    from vllm_jax.server.serving import ServingContext

    engine = SimpleNamespace(dead=False, ready=False, shutting_down=True, error=None)
    with pytest.raises(APIError) as info:
        ServingContext(engine=engine, served_model_names=["m"]).require_ready()
    assert info.value.status == 503 and info.value.code == "engine_shutting_down"
    assert "shutting down" in info.value.message

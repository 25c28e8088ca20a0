"""Schema fuzzing: schemathesis generates requests from the server's own /openapi.json (valid ones, and ones
that violate the schema) and sends them to a real server on 127.0.0.1 serving a tiny model.

Every response must be: not a 5xx; a status, content type and body the schema documents; a 4xx for a request
that violates the schema; and, when it is an error, OpenAI's error body. Streams must end with `data: [DONE]`.
Half of the valid requests are first "repaired" (token ids folded into the vocabulary, the options this server
refuses dropped) so that they get past validation and drive the engine, not only the validators. The run is
derandomized (the same examples on every run) and bounded: EXAMPLES per operation and mode, short generations
(max_model_len 64). Afterwards the engine must be idle with every KV block free, and still serve.

A deeper run, with other examples:
`VLLM_JAX_FUZZ_EXAMPLES=2000 VLLM_JAX_FUZZ_SEED=7 pytest tests/served/test_api_fuzz.py`.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers.http_checks import openai_error
from tests.helpers.live_server import Served, start_server, tiny_checkpoint
from tests.helpers.tiny_models import VOCAB_SIZE

API_KEY = "sk-fuzz"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
EXAMPLES = int(os.environ.get("VLLM_JAX_FUZZ_EXAMPLES", "120"))
SEED = os.environ.get("VLLM_JAX_FUZZ_SEED")  # unset: derandomized, the same examples on every run
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]
# Options the server refuses by design (400): dropped by the repair so that generation runs.
_REFUSED = ("model", "suffix", "best_of", "tools", "tool_choice", "response_format", "prompt_logprobs",
            "stream_options")
_TOKEN_ID_FIELDS = ("prompt", "stop_token_ids", "allowed_token_ids", "tokens")

OPERATIONS = [
    ("POST", "/v1/completions", GenerationMode.POSITIVE), ("POST", "/v1/completions", GenerationMode.NEGATIVE),
    ("POST", "/v1/chat/completions", GenerationMode.POSITIVE),
    ("POST", "/v1/chat/completions", GenerationMode.NEGATIVE),
    ("POST", "/tokenize", GenerationMode.POSITIVE), ("POST", "/tokenize", GenerationMode.NEGATIVE),
    ("POST", "/detokenize", GenerationMode.POSITIVE), ("POST", "/detokenize", GenerationMode.NEGATIVE),
    # GET routes without a body or query: only their path parameter can be fuzzed, and only with valid strings
    ("GET", "/v1/models", GenerationMode.POSITIVE), ("GET", "/v1/models/{model_id}", GenerationMode.POSITIVE),
]
STATUSES: collections.Counter = collections.Counter()  # (path, status) over the whole module, for the summary


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = start_server(tiny_checkpoint(tmp_path_factory.mktemp("fuzz")), api_key=API_KEY)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def schema(served: Served) -> Any:
    return schemathesis.openapi.from_url(f"{served.url}/openapi.json")


def _in_vocab(value: Any) -> Any:
    if isinstance(value, list):
        return [_in_vocab(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) % VOCAB_SIZE
    return value


def _repair(body: dict[str, Any]) -> None:
    """Make a valid-by-schema body likely to be served: what the schema cannot say, said here."""
    for name in _REFUSED:
        body.pop(name, None)
    for name in _TOKEN_ID_FIELDS:
        if name in body:
            body[name] = _in_vocab(body[name])
    if isinstance(body.get("logit_bias"), dict):
        body["logit_bias"] = {str(i % VOCAB_SIZE): v for i, v in enumerate(body["logit_bias"].values())}
    for message in body.get("messages") or []:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            message["content"] = " ".join(str(p.get("text") or "") for p in message["content"])


def _check_openai_shape(response: Any) -> None:
    """An error has OpenAI's body; a stream ends with [DONE] and carries no error event (schemathesis's
    Response: headers map to lists of values)."""
    content_type = (response.headers.get("content-type") or [""])[0]
    text = response.content.decode("utf-8")
    if response.status_code >= 400:
        openai_error(httpx.Response(response.status_code, content=response.content))
    elif content_type.startswith("text/event-stream"):
        events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", text[-500:]
        for event in events[:-1]:
            assert "error" not in json.loads(event), event


@pytest.mark.parametrize(("method", "path", "mode"), OPERATIONS,
                         ids=[f"{m} {p} {g.value}" for m, p, g in OPERATIONS])
def test_fuzzed_requests_never_get_a_5xx_and_conform_to_the_schema(served: Served, schema: Any, method: str,
                                                                      path: str, mode: GenerationMode) -> None:
    operation = schema[path][method]

    @settings(max_examples=EXAMPLES, derandomize=SEED is None, database=None, deadline=None, print_blob=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    @seed(int(SEED or 0))
    @given(case=operation.as_strategy(generation_mode=mode), repair=st.booleans())
    def fuzz(case: Any, repair: bool) -> None:
        if repair and mode.is_positive and isinstance(case.body, dict):
            _repair(case.body)
        response = case.call(base_url=served.url, headers=AUTH, timeout=60)
        STATUSES[(path, mode.value, response.status_code)] += 1
        case.validate_response(response, checks=CHECKS, headers=AUTH)
        _check_openai_shape(response)

    fuzz()


def test_after_fuzzing_the_engine_is_idle_and_still_serves(served: Served) -> None:
    assert STATUSES, "the fuzz tests did not run"
    assert not [k for k in STATUSES if k[2] >= 500]
    served.assert_idle()
    resp = httpx.post(f"{served.url}/v1/completions", headers=AUTH, timeout=60,
                      json={"prompt": "still there", "max_tokens": 3, "ignore_eos": True})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
    summary = collections.Counter()
    for (_, _, status), count in STATUSES.items():
        summary[status] += count
    print(f"\nfuzzed requests: {sum(summary.values())}, by status: {dict(sorted(summary.items()))}")

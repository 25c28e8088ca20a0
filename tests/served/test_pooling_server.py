"""The pooling routes on a served engine (a tiny Qwen3 saved as a sentence-transformers model): the openai SDK's
embeddings.create (float, base64, dimensions), langchain-openai's OpenAIEmbeddings, /v1/rerank and /score, the
400s for bad input, and a generation route refused with the runner's name."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
from openai import OpenAI

from tests.helpers.engine_flags import tiny_engine_flags
from tests.helpers.http_checks import metric, wait_idle_metrics
from tests.helpers.live_server import serve, tiny_engine_args
from tests.helpers.pooling_models import make_sentence_transformer
from vllm_jax.cli import main
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.metrics.prometheus import PrometheusStatLogger

MODEL = "tiny-embed"
SIZES = dict(max_num_seqs=4, max_num_batched_tokens=16, min_token_bucket=16)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_sentence_transformer(tmp_path_factory.mktemp("served") / "qwen3")


@pytest.fixture(scope="module")
def server(checkpoint):
    args = tiny_engine_args(checkpoint, **SIZES)
    metrics = PrometheusStatLogger(MODEL)
    served = serve(AsyncLLM.from_engine_args(args, stat_loggers=[metrics]), model_names=(MODEL,), metrics=metrics)
    yield served
    served.stop()


def test_openai_sdk_embeddings(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="EMPTY")
    texts = ["hello world", "the quick brown fox"]
    result = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    vectors = [np.asarray(d.embedding) for d in result.data]
    assert [d.index for d in result.data] == [0, 1] and all(len(v) == 64 for v in vectors)
    assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in vectors)
    assert result.usage.prompt_tokens == result.usage.total_tokens > 0
    raw = httpx.post(f"{server.url}/v1/embeddings", json={"model": MODEL, "input": texts[0],
                                                          "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(decoded, vectors[0], atol=1e-6)
    short = client.embeddings.create(model=MODEL, input=[[259, 260, 261]], dimensions=8)
    assert len(short.data[0].embedding) == 8
    server.assert_idle()


def test_langchain_openai_embeddings(server):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model=MODEL, base_url=f"{server.url}/v1", api_key="EMPTY",
                                  check_embedding_ctx_length=False)  # no tiktoken: texts go as they are
    query = embeddings.embed_query("hello world")
    documents = embeddings.embed_documents(["hello world", "lazy dog"])
    assert len(query) == 64 and len(documents) == 2
    np.testing.assert_allclose(query, documents[0], atol=1e-6)


def test_rerank_and_score(server):
    body = {"model": MODEL, "query": "fox", "documents": ["a quick brown fox", "lazy dog", "fox"], "top_n": 2}
    rerank = httpx.post(f"{server.url}/v1/rerank", json=body).json()
    assert len(rerank["results"]) == 2 and rerank["usage"]["total_tokens"] > 0
    assert rerank["results"][0]["relevance_score"] >= rerank["results"][1]["relevance_score"]
    assert rerank["results"][0]["index"] == 2  # the document equal to the query: cosine 1
    assert rerank["results"][0]["document"]["text"] == "fox"
    score = httpx.post(f"{server.url}/score", json={"model": MODEL, "text_1": "fox",
                                                    "text_2": ["fox", "lazy dog"]}).json()
    assert abs(score["data"][0]["score"] - 1.0) < 1e-5


@pytest.mark.parametrize("path, body, param", [
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": ""}, "input"),
    ("/v1/embeddings", {"input": [[5] * 100]}, "input"),
    ("/v1/embeddings", {"input": "hi", "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"input": "hi", "dimensions": 65}, "dimensions"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/classify", {"input": "hi"}, "model"),
])
def test_bad_input_is_a_400_naming_the_field(server, path, body, param):
    response = httpx.post(f"{server.url}{path}", json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text


def test_generation_route_on_a_pooling_server_names_the_runner(server):
    response = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert response.status_code == 400
    assert "runner pooling" in response.json()["error"]["message"]
    server.assert_idle()


def test_metrics_count_pooling_requests(server):
    """vLLM's counters cover pooling requests: each input is a request that succeeds with finish_reason "stop",
    its prompt tokens are counted, nothing is generated, and nothing stays running or holds KV blocks."""
    before = wait_idle_metrics(server.url)
    client = OpenAI(base_url=f"{server.url}/v1", api_key="EMPTY")
    result = client.embeddings.create(model=MODEL, input=["one two three", "four five", "six"])
    after = wait_idle_metrics(server.url)

    def grew(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert grew("vllm:request_success_total", finished_reason="stop") == 3
    assert grew("vllm:prompt_tokens_total") == result.usage.prompt_tokens > 0
    assert grew("vllm:generation_tokens_total") == 0
    assert metric(after, "vllm:num_requests_running") == metric(after, "vllm:kv_cache_usage_perc") == 0


def test_run_batch_answers_pooling_lines_as_the_server_does(server, checkpoint, tmp_path):
    """`vllm-jax run-batch` on the pooling model: /v1/embeddings, /v1/score and /v1/rerank lines get the bodies
    the server answers for the same bodies (ids and timestamps aside)."""
    bodies = {
        "emb": ("/v1/embeddings", {"model": MODEL, "input": ["hello world", "lazy dog"]}),
        "score": ("/v1/score", {"model": MODEL, "text_1": "hello", "text_2": ["hello world", "lazy dog"]}),
        "rerank": ("/v1/rerank", {"model": MODEL, "query": "hello", "documents": ["hello world", "lazy dog"]}),
    }
    lines = [json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})
             for cid, (url, body) in bodies.items()]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(out), *tiny_engine_flags(checkpoint, **SIZES),
                 "--served-model-name", MODEL, "--disable-progress-bar"]) == 0
    results = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(results) == set(bodies)
    volatile = ("id", "created")
    for cid, (url, body) in bodies.items():
        assert results[cid]["error"] is None and results[cid]["response"]["status_code"] == 200, results[cid]
        got = {k: v for k, v in results[cid]["response"]["body"].items() if k not in volatile}
        expected = {k: v for k, v in httpx.post(server.url + url, json=body, timeout=60).json().items()
                    if k not in volatile}
        assert got.keys() == expected.keys(), cid
        # the same shape and words; the numbers within float32 rounding (a batch may pad its rows otherwise)
        assert _skeleton(got) == _skeleton(expected), cid
        np.testing.assert_allclose(_numbers(got), _numbers(expected), atol=1e-5, err_msg=cid)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _skeleton(value):
    """`value` with each number replaced by its type's name."""
    if isinstance(value, dict):
        return {k: _skeleton(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_skeleton(v) for v in value]
    return "number" if _is_number(value) else value


def _numbers(value) -> list[float]:
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in _numbers(value[k])]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [float(value)] if _is_number(value) else []

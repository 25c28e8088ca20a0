"""The pooling routes on a served engine (a tiny Qwen3 saved as a sentence-transformers model): the openai SDK's
embeddings.create (float, base64, dimensions), langchain-openai's OpenAIEmbeddings, /v1/rerank and /score, the
400s for bad input, and a generation route refused with the runner's name."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
from openai import OpenAI

from tests.helpers.http_checks import metric, wait_idle_metrics
from tests.helpers.live_server import serve, tiny_engine_args
from tests.helpers.pooling_models import make_sentence_transformer
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.metrics.prometheus import PrometheusStatLogger

MODEL = "tiny-embed"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_sentence_transformer(tmp_path_factory.mktemp("served") / "qwen3")
    args = tiny_engine_args(path, max_num_seqs=4, max_num_batched_tokens=16, min_token_bucket=16)
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

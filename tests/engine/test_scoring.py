"""Scoring over /v1/completions: `echo` with `logprobs` (and `max_tokens: 0`) returns the prompt's logprobs in
OpenAI's legacy format, as vLLM does, and lm-eval's `local-completions` model gets from our server the same
loglikelihoods and generations as lm-eval's own `hf` model on the same tiny weights.

The tiny Llama's LM head gives every non-letter token a zero logit (tests/helpers/tiny_models.py: letters are
ids 259..284), so greedy text is letters, which both sides decode alike, and a letter continuation can be greedy.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.helpers.live_server import LETTERS, MODEL, TEMPLATE, Served, serve, tiny_engine_args
from tests.helpers.tiny_models import byte_tokenizer, make_tiny_checkpoint
from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.outputs import CompletionOutput, Logprob, RequestOutput
from vllm_jax.server.logprobs import completion_logprobs
from vllm_jax.server.protocol import CompletionRequest
from vllm_jax.server.serving_completions import _stream

PROMPT = "the sea is calm"
TOLERANCE = 1e-4  # lm-eval's loglikelihoods, ours against hf's


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scoring") / "llama"
    model = make_tiny_checkpoint("llama", path)
    with torch.no_grad():
        model.lm_head.weight[:LETTERS[0]] = 0.0
        model.lm_head.weight[LETTERS[-1] + 1:] = 0.0
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def served(checkpoint: Path) -> Iterator[Served]:
    s = serve(AsyncLLM.from_engine_args(tiny_engine_args(checkpoint)), enable_tokenizer_info=True)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, timeout=60) as c:
        yield c


def _complete(http: httpx.Client, **body: Any) -> dict[str, Any]:
    resp = http.post("/v1/completions", json={"model": MODEL, "temperature": 0, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def _streamed(http: httpx.Client, **body: Any) -> list[dict[str, Any]]:
    """The choices of a stream's chunks, in order."""
    with http.stream("POST", "/v1/completions", json={"model": MODEL, "temperature": 0, "stream": True,
                                                      **body}) as resp:
        assert resp.status_code == 200
        events = [line[len("data: "):] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [choice for event in events[:-1] for choice in json.loads(event)["choices"]]


def _assert_same_choice(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Text, finish reason, tokens and offsets equal; the logprobs equal to float32 rounding: two requests for
    the same prompt may have it prefilled in other chunks (how many of a step's tokens each request got depends on
    when it arrived), which sums its attention in another order."""
    assert (got["text"], got["finish_reason"]) == (want["text"], want["finish_reason"])
    got_lp, want_lp = got["logprobs"], want["logprobs"]
    assert (got_lp["tokens"], got_lp["text_offset"]) == (want_lp["tokens"], want_lp["text_offset"])
    assert [x is None for x in got_lp["token_logprobs"]] == [x is None for x in want_lp["token_logprobs"]]
    np.testing.assert_allclose([x for x in got_lp["token_logprobs"] if x is not None],
                               [x for x in want_lp["token_logprobs"] if x is not None], rtol=1e-5, atol=1e-6)
    assert [None if t is None else sorted(t) for t in got_lp["top_logprobs"]] == \
        [None if t is None else sorted(t) for t in want_lp["top_logprobs"]]
    for g, w in zip(got_lp["top_logprobs"], want_lp["top_logprobs"]):
        if g is not None:
            np.testing.assert_allclose([g[k] for k in sorted(g)], [w[k] for k in sorted(w)], rtol=1e-5, atol=1e-6)


def _joined(choices: list[dict[str, Any]]) -> dict[str, Any]:
    """One choice's stream chunks as one choice: texts and logprob lists concatenated."""
    lists = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    return {"text": "".join(c["text"] for c in choices), "finish_reason": choices[-1]["finish_reason"],
            "logprobs": {k: [x for c in choices for x in c["logprobs"][k]] for k in lists}}


# ---- the format, without a server -------------------------------------------------------------------------------

def test_legacy_logprobs_null_the_unscored_first_token_and_keep_the_top_n_plus_the_token() -> None:
    steps = [None, {260: Logprob(-1.5, 2, "b"), 261: Logprob(-0.25, 1, "c"), 262: Logprob(-3.0, 3, "d")},
             {259: Logprob(-math.inf, 9, "a")}]
    out, end = completion_logprobs([259, 260, 259], steps, 1, byte_tokenizer(), 5)
    assert out.tokens == ["a", "b", "a"]
    assert out.token_logprobs == [None, -1.5, -9999.0]
    assert out.top_logprobs == [None, {"b": -1.5, "c": -0.25}, {"a": -9999.0}]
    assert (out.text_offset, end) == ([5, 6, 7], 8)


def test_echo_scores_the_prompt_with_logprobs_and_max_tokens_0_generates_one_token_internally() -> None:
    params = CompletionRequest(prompt="x", echo=True, logprobs=2, max_tokens=0).to_sampling_params(64, 1)
    assert (params.prompt_logprobs, params.logprobs, params.max_tokens) == (2, 2, 1)
    wider = CompletionRequest(prompt="x", echo=True, logprobs=1, prompt_logprobs=5).to_sampling_params(64, 1)
    assert (wider.prompt_logprobs, wider.logprobs) == (5, 1)
    assert CompletionRequest(prompt="x", logprobs=2).to_sampling_params(64, 1).prompt_logprobs is None
    with pytest.raises(ValueError, match="^max_tokens must be >= 1, got 0 .*echo"):
        CompletionRequest(prompt="x", max_tokens=0).check_unsupported()


class _Streams:
    """RequestStreams' iteration, over outputs a test wrote."""

    def __init__(self, outputs: list[tuple[int, RequestOutput]]):
        self.outputs = outputs

    async def __aiter__(self) -> Any:
        for item in self.outputs:
            yield item

    async def close(self) -> None:
        pass


def test_a_streamed_echo_waits_for_its_prompts_scores_even_when_another_completion_computes_them() -> None:
    """n=2: completion 1 samples before completion 0's prefill has scored the whole prompt (as after a
    preemption); its echo must still carry every prompt position's score."""
    prompt = [259, 260, 261]

    def out(index: int, token: int, logprob: float, finish: str | None = None) -> CompletionOutput:
        return CompletionOutput(index, chr(token - 259 + ord("a")), [token], None,
                                [{token: Logprob(logprob, 1, None)}], finish)

    def step(scores: list | None, *outs: CompletionOutput) -> tuple[int, RequestOutput]:
        return 0, RequestOutput("r", None, prompt, scores, list(outs), False)

    outputs = [step([None, {260: Logprob(-1.0, 1, None)}], out(1, 262, -0.5)),
               step([{261: Logprob(-2.0, 1, None)}], out(0, 263, -0.75)),
               step(None, out(0, 264, -0.125, "length"), out(1, 265, -0.25, "length"))]
    body = CompletionRequest(prompt=prompt, n=2, echo=True, logprobs=0, max_tokens=2, stream=True)
    ctx = SimpleNamespace(engine=SimpleNamespace(tokenizer=byte_tokenizer()))

    async def run() -> list[str]:
        return [e async for e in _stream(ctx, body, _Streams(outputs), "cmpl-1", MODEL, ["abc"])]

    events = asyncio.run(run())
    assert events[-1] == "data: [DONE]\n\n"
    choices = [c for e in events[:-1] for c in json.loads(e[len("data: "):])["choices"]]
    assert sorted(c["index"] for c in choices[:2]) == [0, 1] and [c["index"] for c in choices[2:]] == [0, 1]
    first = {c["index"]: c for c in choices[:2]}
    assert first[1]["text"] == "abcd" and first[1]["logprobs"]["token_logprobs"] == [None, -1.0, -2.0, -0.5]
    assert first[0]["text"] == "abce" and first[0]["logprobs"]["token_logprobs"] == [None, -1.0, -2.0, -0.75]
    assert choices[3]["logprobs"]["text_offset"] == [4] and choices[3]["finish_reason"] == "length"


# ---- the live server ----------------------------------------------------------------------------------------------

def test_echo_with_logprobs_returns_the_engines_prompt_logprobs_then_the_completions(http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    scored = _complete(http, prompt=PROMPT, max_tokens=1, prompt_logprobs=2)["choices"][0]["prompt_logprobs"]
    choice = _complete(http, prompt=PROMPT, max_tokens=2, echo=True, logprobs=2)["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"].startswith(PROMPT) and "".join(lp["tokens"]) == choice["text"]
    assert len(lp["tokens"]) == len(ids) + 2
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for k in range(1, len(ids)):
        entry = scored[k]
        assert lp["token_logprobs"][k] == entry[str(ids[k])]["logprob"]
        assert lp["top_logprobs"][k] == {e["decoded_token"]: e["logprob"] for e in entry.values()}
    for logprob, top in zip(lp["token_logprobs"][len(ids):], lp["top_logprobs"][len(ids):]):
        assert logprob == max(top.values()) and len(top) <= 3  # greedy: the token is the top one
    assert lp["text_offset"] == [len("".join(lp["tokens"][:k])) for k in range(len(ids) + 2)]
    assert choice["prompt_logprobs"] == scored  # vLLM returns the prompt logprobs it computed, too


def test_max_tokens_0_with_echo_returns_the_prompt_alone(http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    full = _complete(http, prompt=ids, max_tokens=1, echo=True, logprobs=1)["choices"][0]["logprobs"]
    out = _complete(http, prompt=ids, max_tokens=0, echo=True, logprobs=1)
    choice = out["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert choice["logprobs"] == {k: v[:len(ids)] for k, v in full.items()}
    assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}
    plain = _complete(http, prompt=PROMPT, max_tokens=0, echo=True)["choices"][0]
    assert (plain["text"], plain["logprobs"]) == (PROMPT, None)


def test_max_tokens_0_without_echo_is_a_400_naming_max_tokens(http: httpx.Client) -> None:
    resp = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 0, "logprobs": 1})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "max_tokens" and "echo" in resp.json()["error"]["message"]


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_a_streamed_echo_adds_up_to_the_response(http: httpx.Client, max_tokens: int) -> None:
    body = dict(prompt=PROMPT, max_tokens=max_tokens, echo=True, logprobs=1, ignore_eos=True)
    whole = _complete(http, **body)["choices"][0]
    chunks = _streamed(http, **body)
    assert chunks[0]["text"].startswith(PROMPT)
    _assert_same_choice(_joined(chunks), whole)


def test_every_prompt_and_completion_echoes_its_own_prompt(http: httpx.Client) -> None:
    """Two prompts, n=2, one prompt longer than a step's 32 tokens (scored over two prefill chunks)."""
    prompts = [LETTERS[:5], (LETTERS * 2)[:40]]
    body = dict(prompt=prompts, n=2, max_tokens=2, echo=True, logprobs=1, ignore_eos=True)
    whole = _complete(http, **body)["choices"]
    streamed = _streamed(http, **body)
    for index, choice in enumerate(whole):
        ids = prompts[index // 2]
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(ids) + 2 and lp["token_logprobs"][0] is None
        assert all(x is not None for x in lp["token_logprobs"][1:])
        _assert_same_choice(_joined([c for c in streamed if c["index"] == index]), choice)
    for a, b in ((0, 1), (2, 3)):  # a prompt scores the same whichever completion echoes it
        n = len(prompts[a // 2])
        assert whole[a]["logprobs"]["token_logprobs"][:n] == whole[b]["logprobs"]["token_logprobs"][:n]


def test_tokenizer_info_serves_the_tokenizers_configuration(http: httpx.Client, served: Served) -> None:
    from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support

    info = http.get("/tokenizer_info").json()
    assert (info["bos_token"], info["eos_token"], info["unk_token"]) == ("<s>", "</s>", "<unk>")
    assert info["tokenizer_class"] == type(served.engine.tokenizer).__name__
    assert info["chat_template"] == TEMPLATE and "vocab_file" not in info
    assert check_remote_tokenizer_support(served.url)
    remote = RemoteTokenizer(served.url)
    assert remote.eos_token_id == 2 and remote.encode(PROMPT) == byte_tokenizer().encode(PROMPT)


# ---- lm-eval ------------------------------------------------------------------------------------------------------

def _write_tasks(root: Path, greedy: str) -> Path:
    """A multiple-choice and a generation task over local JSON lines (lm-eval's `json` dataset: no download).
    `greedy` is the model's own continuation of "abc": a choice lm-eval must find greedy."""
    mc = [{"question": "the cat sat on the ", "choices": ["mat", "hat", "sky"], "answer": 0},
          {"question": "one two", "choices": [" three", " four"], "answer": 1},
          {"question": "abc", "choices": ["xyz", greedy, "q r"], "answer": 1}]
    gen = [{"prompt": "once upon a", "target": "time"}, {"prompt": "hello", "target": "world"}]
    tasks = {"scoring_mc": (mc, {"output_type": "multiple_choice", "doc_to_text": "{{question}}",
                                 "target_delimiter": "",
                                 "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}",
                                 "metric_list": [{"metric": "acc"}]}),
             "scoring_gen": (gen, {"output_type": "generate_until", "doc_to_text": "{{prompt}}",
                                   "doc_to_target": "{{target}}", "metric_list": [{"metric": "exact_match"}],
                                   "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False}})}
    for name, (docs, spec) in tasks.items():
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        spec = {"task": name, "dataset_path": "json", "test_split": "test", **spec,
                "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(root / "datasets")}}
        (root / f"{name}.yaml").write_text(json.dumps(spec))  # JSON is YAML
    return root


def test_lm_eval_local_completions_scores_and_generates_as_its_hf_model(
        served: Served, http: httpx.Client, checkpoint: Path, tmp_path: Path) -> None:
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    greedy = _complete(http, prompt="abc", max_tokens=3)["choices"][0]["text"]
    tasks = TaskManager(include_path=str(_write_tasks(tmp_path, greedy)))

    def samples(lm: Any) -> dict[str, list[dict[str, Any]]]:
        return lm_eval.simple_evaluate(model=lm, tasks=["scoring_mc", "scoring_gen"], task_manager=tasks,
                                       log_samples=True, bootstrap_iters=0)["samples"]

    ours = samples(LocalCompletionsAPI(base_url=f"{served.url}/v1/completions", model=MODEL,
                                       tokenizer_backend="huggingface", tokenizer=str(checkpoint), batch_size=4,
                                       max_retries=1))
    theirs = samples(HFLM(pretrained=str(checkpoint), device="cpu", dtype="float32", batch_size=1))
    # per choice: [(loglikelihood, is_greedy)] from each model
    pairs = [(a[0], b[0]) for doc_a, doc_b in zip(ours["scoring_mc"], theirs["scoring_mc"], strict=True)
             for a, b in zip(doc_a["resps"], doc_b["resps"], strict=True)]
    assert len(pairs) == 8
    for (ll, is_greedy), (hf_ll, hf_is_greedy) in pairs:
        assert math.isfinite(ll) and abs(ll - hf_ll) <= TOLERANCE and is_greedy == hf_is_greedy
    assert [is_greedy for (_, is_greedy), _ in pairs] == [False] * 6 + [True, False]
    generations = [doc["resps"] for doc in ours["scoring_gen"]]
    assert generations == [doc["resps"] for doc in theirs["scoring_gen"]]
    assert all(text[0][0] for text in generations)  # letters, not nothing

"""`vllm-jax chat` / `complete` against a live server through the openai client: --quick answers once, the
interactive chat sends its history with every turn."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.helpers.live_server import MODEL, Served, start_server, tiny_checkpoint
from vllm_jax.cli import main


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = start_server(tiny_checkpoint(tmp_path_factory.mktemp("chat")), log_requests=True)
    yield s
    s.stop()


def test_chat_and_complete_quick_print_the_streamed_answer(served, capsys):
    url = f"{served.url}/v1"
    assert main(["chat", "--url", url, "--quick", "hi", "--max-tokens", "3"]) == 0  # the listed model
    assert main(["complete", "--url", url, "--model-name", MODEL, "--quick", "abc", "--max-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 2 and "Using model" not in out


def test_interactive_chat_keeps_the_history(served, monkeypatch, capsys, caplog):
    turns = iter(["x", "y"])  # short: the tiny model reads at most 64 bytes

    def fake_input(prompt: str) -> str:
        try:
            return next(turns)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
    assert main(["chat", "--url", f"{served.url}/v1", "--model-name", MODEL, "--system-prompt", "b",
                 "--max-tokens", "1"]) == 0
    assert f"Using model: {MODEL}" in capsys.readouterr().out
    prompts = [r.getMessage() for r in caplog.records if "prompt=" in r.getMessage()]
    # --enable-log-requests logs each request's messages: the second turn carries the first and its answer
    assert len(prompts) == 2 and "'b'" in prompts[0] and "'y'" not in prompts[0]
    assert all(f"'content': '{text}'" in prompts[1] for text in "bxy")
    assert "'role': 'assistant'" in prompts[1]


def test_collect_env_reports_versions_devices_and_redacts_secrets(monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert main(["collect-env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"python", "platform", "cpu", "cpu_count", "packages", "jax", "environment"} <= set(report)
    assert {"jax", "jaxlib", "libtpu", "flax", "transformers"} <= set(report["packages"])
    assert report["jax"]["device_count"] >= 1 and report["jax"]["backend"] == "cpu"
    assert report["environment"]["HF_TOKEN"] == "<redacted>" and "hf_secret" not in json.dumps(report)

"""Security: where the server listens, what the API key guards and how it is compared, that loading a model never
runs code from it, and that prompts stay out of the logs unless asked for.

Pickled weights are refused by the loader: tests/engine/test_loading.py::test_pickle_checkpoints_are_refused (a
directory with only `pytorch_model.bin` fails and names pickle as the reason).
"""

from __future__ import annotations

import ast
import hmac
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

import vllm_jax
from tests.helpers.http_checks import openai_error
from tests.helpers.live_server import MODEL, Served, start_server, tiny_checkpoint
from vllm_jax.cli import build_parser, main
from vllm_jax.config import EngineArgs
from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.model_loader.tokenizer import load_tokenizer
from vllm_jax.server import launcher
from vllm_jax.server.middleware import OPEN_PATHS

API_KEY = "sk-security-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PACKAGE = Path(vllm_jax.__file__).parent
EVIL = """from pathlib import Path
Path(__file__).with_name("CODE_RAN").write_text("the checkpoint's code was executed")
raise SystemExit("remote code ran")
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("security"))


@pytest.fixture(scope="module")
def served(checkpoint: Path) -> Iterator[Served]:
    s = start_server(checkpoint, api_key=API_KEY, access_log=True)
    yield s
    s.stop()


# ---- where it listens ---------------------------------------------------------------------------------------

def _bound_host(monkeypatch: pytest.MonkeyPatch, checkpoint: Path, *flags: str) -> str:
    """The host `vllm-jax serve` would bind (the socket call is intercepted: nothing listens)."""
    hosts: list[str] = []

    def no_socket(host: str, port: int) -> None:
        hosts.append(host)
        raise OSError("the test does not listen")

    monkeypatch.setattr(launcher, "bind_socket", no_socket)
    assert main(["serve", str(checkpoint), *flags]) == 1
    return hosts[0]


def test_serve_binds_loopback_by_default(monkeypatch: pytest.MonkeyPatch, checkpoint: Path) -> None:
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    assert _bound_host(monkeypatch, checkpoint) == "127.0.0.1"


def test_serve_binds_another_address_only_when_host_says_so(monkeypatch: pytest.MonkeyPatch,
                                                            checkpoint: Path) -> None:
    assert _bound_host(monkeypatch, checkpoint, "--host", "0.0.0.0") == "0.0.0.0"


# ---- the API key ---------------------------------------------------------------------------------------------

def _requests(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every route of the app, path parameters filled with the served model name."""
    out = []
    for route in app.routes:
        if isinstance(route, APIRoute):
            path = route.path.replace("{model_id:path}", MODEL).replace("{model_id}", MODEL)
            out += [(method, path) for method in sorted(route.methods)]
    return out


def test_api_key_guards_every_route_but_the_probes_and_docs(served: Served) -> None:
    routes = _requests(served.app)
    guarded = [(m, p) for m, p in routes if p not in OPEN_PATHS]
    assert {p for _, p in guarded} >= {"/v1/completions", "/v1/chat/completions", "/v1/models", f"/v1/models/{MODEL}",
                                       "/tokenize", "/detokenize"}
    unversioned = ("/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank", "/v2/rerank")  # vLLM's
    assert all(p.startswith("/v1/") or p in unversioned for _, p in guarded), guarded
    same_length = "Bearer " + "x" * len(API_KEY)
    for method, path in guarded:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": same_length},
                        {"Authorization": API_KEY}, {"Authorization": f"bearer {API_KEY}"},
                        {"Authorization": f"Bearer {API_KEY}x"}, {"Authorization": b"Bearer \xff\xfe"}):
            resp = httpx.request(method, f"{served.url}{path}", headers=headers, json={})
            assert openai_error(resp, 401)["code"] == "invalid_api_key", (method, path, headers)
        resp = httpx.request(method, f"{served.url}{path}", headers=AUTH, json={"prompt": "a", "tokens": [1]})
        assert resp.status_code != 401, (method, path)
    for path in ("/health", "/metrics", "/version"):
        assert httpx.get(f"{served.url}{path}").status_code == 200, path


def test_api_key_is_compared_in_constant_time(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert httpx.get(f"{served.url}/v1/models", headers={"Authorization": "Bearer sk-guess"}).status_code == 401
    assert httpx.get(f"{served.url}/v1/models", headers=AUTH).status_code == 200
    assert calls == [(b"Bearer sk-guess", f"Bearer {API_KEY}".encode()), (f"Bearer {API_KEY}".encode(),) * 2]


# ---- loading never runs the checkpoint's code ---------------------------------------------------------------

def _calls(tree: ast.AST) -> Iterator[tuple[str, ast.Call]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
            yield f"{owner}.{name}" if owner else name, node


def test_no_code_path_enables_remote_code_or_unpickles() -> None:
    """Over every module of the package: each from_pretrained passes trust_remote_code=False, nothing passes it
    True, and there is no pickle.load(s), torch.load, or np.load(allow_pickle=True)."""
    from_pretrained = 0
    for file in sorted(PACKAGE.rglob("*.py")):
        for name, call in _calls(ast.parse(file.read_text(), str(file))):
            where = f"{file.relative_to(PACKAGE)}:{call.lineno}"
            kwargs = {k.arg: k.value for k in call.keywords}
            if name.endswith("from_pretrained"):
                from_pretrained += 1
                flag = kwargs.get("trust_remote_code")
                assert isinstance(flag, ast.Constant) and flag.value is False, where
            if "trust_remote_code" in kwargs:
                assert isinstance(kwargs["trust_remote_code"], ast.Constant), where
                assert kwargs["trust_remote_code"].value is False, where
            assert name not in ("pickle.load", "pickle.loads", "torch.load", "dill.load", "joblib.load"), where
            if name.endswith("load") and "allow_pickle" in kwargs:
                assert isinstance(kwargs["allow_pickle"], ast.Constant), where
                assert kwargs["allow_pickle"].value is False, where
    assert from_pretrained >= 2  # AutoConfig and AutoTokenizer: the scan saw them


def _with_remote_code(src: Path, dst: Path, *, model_type: str | None = None) -> Path:
    """A copy of `src` whose config and tokenizer config point at code shipped in the directory (auto_map)."""
    dst.mkdir()
    for file in src.iterdir():
        dst.joinpath(file.name).write_bytes(file.read_bytes())
    config = json.loads((dst / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    if model_type is not None:
        config["model_type"] = model_type
    (dst / "config.json").write_text(json.dumps(config))
    tok_config = json.loads((dst / "tokenizer_config.json").read_text())
    tok_config["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (dst / "tokenizer_config.json").write_text(json.dumps(tok_config))
    (dst / "evil.py").write_text(EVIL)
    return dst


@pytest.fixture
def from_pretrained_kwargs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every AutoConfig / AutoTokenizer.from_pretrained call's kwargs (the calls still happen)."""
    from transformers import AutoConfig, AutoTokenizer

    seen: list[dict[str, Any]] = []
    for cls in (AutoConfig, AutoTokenizer):
        real = cls.from_pretrained

        def spy(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            seen.append(kwargs)
            return _real(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    return seen


def test_auto_map_of_a_known_architecture_is_ignored_and_its_code_never_runs(
        checkpoint: Path, tmp_path: Path, from_pretrained_kwargs: list[dict[str, Any]]) -> None:
    path = _with_remote_code(checkpoint, tmp_path / "remote")
    config = EngineArgs(model=str(path), max_model_len=64).create_config()
    tokenizer = load_tokenizer(config.model_config)
    assert type(config.model_config.hf_config).__name__ == "LlamaConfig"
    assert tokenizer.encode("ab", add_special_tokens=False) == [259, 260]
    assert not (path / "CODE_RAN").exists()
    assert len(from_pretrained_kwargs) >= 2  # ours, and transformers' own from inside AutoTokenizer
    assert all(kw.get("trust_remote_code") is False for kw in from_pretrained_kwargs), from_pretrained_kwargs


def test_auto_map_of_an_unknown_architecture_is_refused_without_running_its_code(
        checkpoint: Path, tmp_path: Path, from_pretrained_kwargs: list[dict[str, Any]]) -> None:
    path = _with_remote_code(checkpoint, tmp_path / "remote", model_type="evil_llama")
    with pytest.raises(ModelSourceError, match="config"):
        EngineArgs(model=str(path), max_model_len=64).create_config()
    assert not (path / "CODE_RAN").exists()
    assert from_pretrained_kwargs and all(kw.get("trust_remote_code") is False for kw in from_pretrained_kwargs)


# ---- logs ----------------------------------------------------------------------------------------------------

def _exercise(served: Served, marker: str) -> None:
    """Requests that carry `marker` in their prompt: served, streamed, tokenized, and refused."""
    url, text = served.url, f"{marker} says hello"
    chat = [{"role": "user", "content": text}]
    with httpx.Client(base_url=url, headers=AUTH, timeout=60) as http:
        assert http.post("/v1/completions", json={"prompt": text, "max_tokens": 2}).status_code == 200
        assert http.post("/v1/chat/completions", json={"messages": chat, "max_tokens": 2}).status_code == 200
        with http.stream("POST", "/v1/completions", json={"prompt": text, "max_tokens": 2, "stream": True}) as resp:
            assert resp.status_code == 200 and list(resp.iter_lines())
        assert http.post("/tokenize", json={"prompt": text}).status_code == 200
        assert http.post("/v1/completions", json={"prompt": text * 50}).status_code == 400  # too long
        assert http.post("/v1/completions", json={"prompt": text, "top_p": 7}).status_code == 400
        assert http.post("/v1/completions", json={"prompt": text, "bad_words": [marker]}).status_code == 200


def test_prompts_stay_out_of_the_logs_unless_enable_log_requests(served: Served, caplog: pytest.LogCaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    assert build_parser().parse_args(["serve"]).enable_log_requests is False
    caplog.set_level(logging.DEBUG)
    # uvicorn's access logger, which servers started with access_log=False (other tests) stop from propagating
    caplog.set_level(logging.DEBUG, logger="uvicorn.access")
    monkeypatch.setattr(logging.getLogger("uvicorn.access"), "propagate", True)
    quiet = f"quiet{uuid.uuid4().hex[:10]}"
    _exercise(served, quiet)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "POST /v1/completions" in logged  # uvicorn's access log was captured: the capture works
    assert quiet not in logged

    caplog.clear()
    served.app.state.serving.log_requests = True  # what --enable-log-requests sets
    try:
        loud = f"loud{uuid.uuid4().hex[:10]}"
        _exercise(served, loud)
    finally:
        served.app.state.serving.log_requests = False
    assert loud in "\n".join(r.getMessage() for r in caplog.records)

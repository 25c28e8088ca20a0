"""The compilation cache: on by default, the first engine stores every warm-up program, a restart loads them all
(no trace, no compile) and generates the same tokens; a corrupt entry is recompiled; the cache can be moved or
turned off.

Engines run in subprocesses: jax's cache directory is process-wide configuration."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers.processes import last_json, run_python
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.config import EngineArgs, resolve_cache_dir

SCRIPT = """
import json, sys
from vllm_jax import LLM, SamplingParams
kwargs = json.loads(sys.argv[2])
llm = LLM(sys.argv[1], max_model_len=64, block_size=8, num_gpu_blocks_override=32, max_num_seqs=8,
          max_num_batched_tokens=32, min_token_bucket=32, min_seq_bucket=8, **kwargs)  # one bucket: fewer programs
runner = llm.llm_engine.runner
store = runner.device.store
warm = {"compiled": runner.num_compilations, "loaded": store.loaded if store else 0,
        "plan": len(runner.warmup_plan()), "cache_dir": runner.compilation_cache_dir}
out = llm.generate([[1, 2, 3, 4, 5]], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
warm["tokens"] = out[0].outputs[0].token_ids
print(json.dumps(warm))
"""


def _env(**extra: str) -> dict[str, str]:
    """A bare environment (no session cache root) keeping the session's XLA flags (tests/conftest.py)."""
    return {"JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), **extra}


def _start(model: Path, env: dict[str, str], **kwargs) -> dict:
    proc = run_python("-c", SCRIPT, str(model), json.dumps(kwargs), env=_env(**env))
    return last_json(proc.stdout) | {"stderr": proc.stderr}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cc") / "model"
    make_tiny_checkpoint("llama", path)
    return path


@pytest.fixture(scope="module")
def cold(model, tmp_path_factory) -> tuple[Path, dict]:
    """One cold start's cache root (every warm-up program stored) and its report, shared by the tests below; a
    test that changes the cache works on its own copy."""
    root = tmp_path_factory.mktemp("cold") / "root"
    return root, _start(model, {"VLLM_JAX_CACHE_ROOT": str(root)})


def _copy(root: Path, tmp_path: Path) -> dict[str, str]:
    shutil.copytree(root, tmp_path / "root")
    return {"VLLM_JAX_CACHE_ROOT": str(tmp_path / "root")}


def test_default_cache_stores_every_program_and_a_restart_loads_them_all(model, cold):
    root, first = cold
    assert first["cache_dir"] == str(root / "compile")
    assert first["compiled"] == first["plan"] and first["loaded"] == 0
    stored = sorted(p.name for p in (root / "compile" / "programs").rglob("*.exe"))
    assert len(stored) == first["plan"]
    warm = _start(model, {"VLLM_JAX_CACHE_ROOT": str(root)})
    assert warm["compiled"] == 0 and warm["loaded"] == warm["plan"]  # nothing traced, nothing compiled
    assert warm["tokens"] == first["tokens"]
    assert f"0 compiled, {warm['plan']} loaded from the compilation cache" in warm["stderr"]
    assert sorted(p.name for p in (root / "compile" / "programs").rglob("*.exe")) == stored


def test_a_different_config_does_not_reuse_programs(model, cold, tmp_path):
    root, first = cold
    other = _start(model, _copy(root, tmp_path), max_logprobs=3)  # the logprobs sampler variant has another K
    assert other["loaded"] == 0 and other["compiled"] == other["plan"]
    assert other["tokens"] == first["tokens"]


def test_a_corrupt_stored_program_is_recompiled(model, cold, tmp_path):
    root, first = cold
    env = _copy(root, tmp_path)
    victim = sorted((tmp_path / "root" / "compile" / "programs").rglob("forward-*.exe"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    warm = _start(model, env)
    assert warm["loaded"] == warm["plan"] - 1 and warm["compiled"] == 1
    assert "dropping unreadable stored program" in warm["stderr"]
    assert warm["tokens"] == first["tokens"]


def test_compilation_cache_dir_moves_it_and_no_compilation_cache_turns_it_off(model, tmp_path):
    moved = _start(model, {}, compilation_cache_dir=str(tmp_path / "mine"))
    assert moved["cache_dir"] == str(tmp_path / "mine") and any((tmp_path / "mine" / "programs").rglob("*.exe"))
    off = _start(model, {"VLLM_JAX_CACHE_ROOT": str(tmp_path / "unused")}, compilation_cache=False)
    assert off["cache_dir"] is None and off["compiled"] == off["plan"]
    # nothing of the compilation cache; the native CPU kernels' libraries (vllm_jax/native/build.py) are not it
    assert not (tmp_path / "unused").exists() or {p.name for p in (tmp_path / "unused").iterdir()} == {"native"}


def test_cache_directory_resolution(monkeypatch):
    monkeypatch.setenv("VLLM_JAX_CACHE_ROOT", "/somewhere")
    assert resolve_cache_dir(None, True) == "/somewhere/compile"
    assert resolve_cache_dir("~/elsewhere", True) == os.path.expanduser("~/elsewhere")
    assert resolve_cache_dir("/x", False) is None
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")  # vLLM's switch
    assert resolve_cache_dir("/x", True) is None
    monkeypatch.delenv("VLLM_JAX_CACHE_ROOT")
    monkeypatch.delenv("VLLM_DISABLE_COMPILE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert resolve_cache_dir(None, True) == "/xdg/vllm_jax/compile"
    assert EngineArgs().compilation_cache is True


SHARED_PROGRAMS = """
import json, sys
from vllm_jax import LLM, SamplingParams
tokens = []
for max_num_seqs in (4, 8, 8):  # 4 and 8 share their smallest buckets' programs
    llm = LLM(sys.argv[1], max_model_len=64, block_size=8, num_gpu_blocks_override=64, max_num_seqs=max_num_seqs,
              max_num_batched_tokens=32)
    out = llm.generate([[1, 2, 3], [4, 5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)
    tokens.append([o.outputs[0].token_ids for o in out])
    store = llm.llm_engine.runner.device.store
    del llm
print(json.dumps({"tokens": tokens, "loaded_last": store.loaded}))
"""


def test_programs_jax_read_from_its_cache_are_not_stored_again(model, tmp_path):
    """The second engine gets its smallest buckets' programs from jax's cache (the first compiled them); storing
    those would store executables without their kernels on CPU, so only its fresh compiles are stored, and the
    third engine, loading them, runs."""
    proc = run_python("-c", SHARED_PROGRAMS, str(model), env=_env(VLLM_JAX_CACHE_ROOT=str(tmp_path / "root")))
    result = last_json(proc.stdout)
    assert result["tokens"][0] == result["tokens"][1] == result["tokens"][2]
    assert result["loaded_last"] > 0

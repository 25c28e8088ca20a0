"""Imports run one way (docs/architecture/01-overview.md, "Layout"): every module of the package is parsed, lazy imports
inside functions included, and a wrong-way import fails here with the module and line that made it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_jax"
# importable from anywhere
LEAVES = {"config", "config_pooling", "sampling_params", "pooling_params", "outputs", "logger", "utils"}
# part of the package -> the other parts it may import (besides LEAVES and itself)
ALLOWED = {
    "server": {"engine", "metrics", "scheduler", "reasoning", "lora", "multimodal"},
    "engine": {"scheduler", "paged_kv", "worker", "model_loader", "metrics", "sharding", "structured_output",
               "reasoning", "lora", "multimodal"},
    "multimodal": {"model"},
    "scheduler": {"paged_kv", "structured_output", "lora"},
    "lora": set(),
    "structured_output": set(),
    "paged_kv": set(),
    "worker": {"model", "model_loader", "sample", "attention", "pallas_kernels", "sharding", "scheduler",
               "spec_decode", "lora", "native"},
    "model": {"attention", "pallas_kernels", "sharding", "native"},
    "model_loader": {"model"},
    "sample": set(),
    "attention": {"pallas_kernels", "sharding", "native"},
    "pallas_kernels": set(),
    "native": set(),
    "sharding": {"pallas_kernels"},
    "metrics": set(),
    "aot": {"attention", "pallas_kernels", "sharding", "model", "worker"},
    "config": {"model_loader", "attention", "sharding", "reasoning", "spec_decode", "lora", "multimodal"},
    "reasoning": set(),
    "spec_decode": set(),
    "sampling_params": set(),
    "pooling_params": set(),
    "config_pooling": set(),
    "outputs": set(),
    "logger": set(),
    "utils": set(),
}
ENTRY_POINTS = {"__init__", "llm", "llm_pooling", "cli"}  # may import anything
FORBIDDEN_LIBRARIES = {
    "scheduler": {"jax", "jaxlib", "flax"},
    "paged_kv": {"jax", "jaxlib", "flax"},
    "structured_output": {"jax", "jaxlib", "flax"},
    "reasoning": {"jax", "jaxlib", "flax"},
    "spec_decode": {"jax", "jaxlib", "flax"},
    "lora": {"jax", "jaxlib", "flax"},
    "engine": {"prometheus_client", "fastapi", "starlette", "uvicorn"},
    "model": {"safetensors", "gguf", "orbax", "huggingface_hub"},
    "config": {"prometheus_client", "fastapi", "uvicorn"},
}


def _part(module_path: Path) -> str:
    rel = module_path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every absolute import target of the file (module names), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pytest.fail(f"{path.relative_to(PACKAGE)}:{node.lineno}: relative import (use absolute ones)")
            found.append((node.module or "", node.lineno))
            # `from vllm_jax import worker` names a part too
            if node.module == "vllm_jax":
                found += [(f"vllm_jax.{alias.name}", node.lineno) for alias in node.names]
    return found


def _violations() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = _part(path)
        where = path.relative_to(PACKAGE.parent)
        for target, line in _imports(path):
            top = target.split(".")[0]
            if top == "tests":
                problems.append(f"{where}:{line} imports the tests ({target})")
            if top in FORBIDDEN_LIBRARIES.get(part, ()):
                problems.append(f"{where}:{line}: {part}/ must not import {top}")
            if top != "vllm_jax" or part in ENTRY_POINTS:
                continue
            pieces = target.split(".")
            if len(pieces) < 2:
                continue
            other = pieces[1]
            if other in (part, *LEAVES) and not (part in LEAVES and other in ENTRY_POINTS):
                continue
            if other not in ALLOWED.get(part, set()):
                problems.append(f"{where}:{line}: {part}/ imports {target} (allowed: "
                                f"{', '.join(sorted(ALLOWED.get(part, set()) | LEAVES)) or 'nothing'})")
    return problems


def test_every_part_of_the_package_is_in_the_import_rules():
    parts = {_part(p) for p in PACKAGE.rglob("*.py")}
    assert parts - ENTRY_POINTS <= set(ALLOWED), parts - ENTRY_POINTS - set(ALLOWED)


def test_imports_run_one_way():
    problems = _violations()
    assert not problems, "wrong-way imports:\n" + "\n".join(problems)


def test_the_rules_catch_a_wrong_way_import(tmp_path):
    """The check itself can fail: a scheduler module importing jax and the server is reported twice."""
    fake = tmp_path / "vllm_jax"
    (fake / "scheduler").mkdir(parents=True)
    (fake / "scheduler" / "bad.py").write_text("import jax\n\ndef f():\n    from vllm_jax.server import api_server\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, fake
    try:
        problems = _violations()
    finally:
        PACKAGE = saved
    assert len(problems) == 2 and "must not import jax" in problems[0] and "imports vllm_jax.server" in problems[1]


def test_every_module_imports():
    """Parsing is not importing: a name moved to another module breaks its importers only when they run."""
    import importlib
    import pkgutil

    import vllm_jax

    failures = []
    for info in pkgutil.walk_packages(vllm_jax.__path__, "vllm_jax."):
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # noqa: BLE001 - report every broken module at once
            failures.append(f"{info.name}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures)

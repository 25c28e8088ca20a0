"""Imports run one way (docs/architecture/01-overview.md, "Layout"): every module of the package is parsed, lazy imports
inside functions included, and a wrong-way import fails here with the module and line that made it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "vllm_jax"
# importable from anywhere
LEAVES = {"config", "sampling_params", "pooling_params", "outputs", "logger", "utils"}
# features whose jax side is a `device/` subpackage: `<feature>/device/` is its own part, `<feature>.device`, so the
# host side stays importable without jax and never imports its own device side
DEVICE_SIDES = {"spec_decode", "pooling", "multimodal", "lora"}
# part of the package -> the other parts it may import (besides LEAVES and itself)
ALLOWED = {
    "server": {"engine", "metrics", "scheduler", "reasoning", "lora", "multimodal"},
    "engine": {"scheduler", "paged_kv", "worker", "model_loader", "metrics", "sharding", "structured_output",
               "reasoning", "lora", "multimodal", "pooling", "pooling.device"},
    "multimodal": {"model"},
    "multimodal.device": {"multimodal", "model", "worker"},
    "scheduler": {"paged_kv", "structured_output", "lora"},
    "lora": set(),
    "lora.device": {"lora", "model"},
    "structured_output": set(),
    "paged_kv": set(),
    # the runner core; its engine builder and runner compose the features' device sides
    "worker": {"model", "model_loader", "sample", "attention", "pallas_kernels", "sharding", "scheduler",
               "spec_decode", "spec_decode.device", "lora", "lora.device", "native", "multimodal.device",
               "pooling.device", "multi_step"},
    "spec_decode.device": {"spec_decode", "model", "model_loader", "sharding", "pallas_kernels", "attention", "native",
                           "worker"},
    "pooling": set(),
    "pooling.device": {"pooling", "model", "model_loader", "pallas_kernels", "scheduler", "worker"},
    "multi_step": {"model", "sample", "scheduler", "worker"},
    "model": {"attention", "pallas_kernels", "sharding", "native"},
    "model_loader": {"model"},
    "sample": set(),
    "attention": {"pallas_kernels", "sharding", "native"},
    "pallas_kernels": set(),
    "native": set(),
    "sharding": {"pallas_kernels"},
    "metrics": set(),
    "aot": {"attention", "pallas_kernels", "sharding", "model", "worker"},
    "config": {"model_loader", "attention", "sharding", "reasoning", "spec_decode", "lora", "multimodal", "pooling"},
    "reasoning": set(),
    "spec_decode": set(),
    "sampling_params": set(),
    "pooling_params": set(),
    "outputs": set(),
    "logger": set(),
    "utils": set(),
}
ENTRY_POINTS = {"__init__", "llm", "cli"}  # may import anything
FORBIDDEN_LIBRARIES = {
    "scheduler": {"jax", "jaxlib", "flax"},
    "paged_kv": {"jax", "jaxlib", "flax"},
    "structured_output": {"jax", "jaxlib", "flax"},
    "reasoning": {"jax", "jaxlib", "flax"},
    "spec_decode": {"jax", "jaxlib", "flax"},
    "lora": {"jax", "jaxlib", "flax"},
    "pooling": {"jax", "jaxlib", "flax"},
    "engine": {"prometheus_client", "fastapi", "starlette", "uvicorn"},
    "model": {"safetensors", "gguf", "orbax", "huggingface_hub"},
    "config": {"prometheus_client", "fastapi", "uvicorn"},
}


def _part(module_path: Path) -> str:
    rel = module_path.relative_to(PACKAGE)
    if len(rel.parts) > 2 and rel.parts[0] in DEVICE_SIDES and rel.parts[1] == "device":
        return f"{rel.parts[0]}.device"
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _target_part(pieces: list[str]) -> str:
    """The part an import of `vllm_jax.<pieces[1]>...` reaches (a feature's device side is a part of its own)."""
    if len(pieces) > 2 and pieces[1] in DEVICE_SIDES and pieces[2] == "device":
        return f"{pieces[1]}.device"
    return pieces[1]


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
            other = _target_part(pieces)
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


def test_a_feature_host_side_may_not_import_its_device_side(tmp_path):
    """`spec_decode/` is pure Python: importing `spec_decode/device/` (jax) from it is reported; the device side
    importing the host side is allowed."""
    fake = tmp_path / "vllm_jax"
    (fake / "spec_decode" / "device").mkdir(parents=True)
    (fake / "spec_decode" / "host.py").write_text("from vllm_jax.spec_decode.device import step\n")
    (fake / "spec_decode" / "device" / "step.py").write_text("import jax\nfrom vllm_jax.spec_decode import config\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, fake
    try:
        problems = _violations()
    finally:
        PACKAGE = saved
    assert len(problems) == 1 and "spec_decode/ imports vllm_jax.spec_decode.device" in problems[0], problems

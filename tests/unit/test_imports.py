"""Imports run one way (docs/architecture/01-overview.md, "Layout"): every module of the package is parsed, lazy imports
inside functions included, and a wrong-way import fails here with the module and line that made it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_jax"
# importable from anywhere
LEAVES = {"sampling_params", "pooling_params", "outputs", "logger", "utils", "cache_root"}
# features whose jax side is a `device/` subpackage: `<feature>/device/` is its own part, `<feature>.device`, so the
# host side stays importable without jax and never imports its own device side
DEVICE_SIDES = {"spec_decode", "pooling", "multimodal", "lora"}
# part of the package -> the other parts it may import (besides LEAVES and itself)
ALLOWED = {
    "server": {"engine", "config", "metrics", "scheduler", "reasoning", "lora", "multimodal"},
    # the `vllm-jax` commands (cli.py only dispatches to them): each drives a public entry point (the server's
    # launcher and app, the engine, LLM, the loader's convert, the aot report, a multi-host follower) and reads the
    # config; nothing but cli.py imports them
    "commands": {"config", "engine", "server", "llm", "model_loader", "aot", "worker", "metrics"},
    "engine": {"config", "scheduler", "paged_kv", "worker", "model_loader", "metrics", "sharding", "structured_output",
               "reasoning", "lora", "multimodal", "pooling", "pooling.device"},
    "multimodal": {"model", "models"},
    "multimodal.device": {"multimodal", "model", "models", "worker"},
    "scheduler": {"config", "paged_kv", "structured_output", "lora"},
    "lora": set(),
    "lora.device": {"lora", "model"},
    "structured_output": set(),
    "paged_kv": set(),
    # the runner core; its engine builder and runner compose the features' device sides
    "worker": {"config", "model", "models", "model_loader", "sample", "attention", "pallas_kernels", "sharding",
               "scheduler", "spec_decode", "spec_decode.device", "lora", "lora.device", "native", "multimodal.device",
               "pooling.device", "multi_step"},
    "spec_decode.device": {"config", "spec_decode", "model", "models", "model_loader", "sharding", "pallas_kernels",
                           "attention", "native", "worker"},
    "pooling": {"config"},
    "pooling.device": {"config", "pooling", "model", "models", "model_loader", "pallas_kernels", "scheduler",
                       "worker"},
    "multi_step": {"model", "sample", "scheduler", "worker"},
    "model": {"attention", "pallas_kernels", "sharding", "native"},
    # config: only tokenizer.py (reads ModelConfig) and convert.py (a command: builds EngineArgs), which nothing
    # that config/model_resolution.py imports reaches (test_no_import_circles would say so)
    "model_loader": {"model", "models", "config"},
    # the families (docs/architecture/16-family-unit.md): above the shared building blocks, below the loader
    "models": {"model", "attention", "pallas_kernels", "sharding", "native"},
    "sample": set(),
    "attention": {"pallas_kernels", "sharding", "native"},
    "pallas_kernels": set(),
    "native": set(),
    "sharding": {"pallas_kernels"},
    "metrics": set(),
    "aot": {"config", "attention", "pallas_kernels", "sharding", "model", "models", "worker"},
    # config sits above the loader: it finds the model through model_loader.source (config/model_resolution.py);
    # model/, attention/, native/ and sharding/ never import it (their cache folder is the cache_root leaf); it asks
    # the registry what a family needs (config/hybrid_checks.py: a recurrent state)
    "config": {"model_loader", "models", "attention", "sharding", "reasoning", "spec_decode", "lora", "multimodal",
               "pooling"},
    "reasoning": set(),
    "spec_decode": set(),
    "sampling_params": set(),
    "pooling_params": set(),
    "cache_root": set(),
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
    "models": {"safetensors", "orbax", "huggingface_hub"},
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


MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80
KERNELS = PACKAGE / "pallas_kernels"  # Pallas kernels are one long traced function each: exempt from the length rule


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at the top, inside functions or under TYPE_CHECKING): `from a.b
    import c` names a.b, and a.b.c too when c is a module."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], int]]:
    """One shortest circle per strongly connected group of modules (Tarjan's algorithm, then a breadth-first walk
    back to the group's first module), each as the modules in import order with the first repeated at the end, and
    the group's size (breaking that circle may leave others in the group)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def visit(root: str) -> None:  # iterative, so that no chain of imports meets the recursion limit
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted((_shortest_circle(graph, group), len(group)) for group in groups)


def _shortest_circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest walk from the group's first module back to itself, breadth first inside the group."""
    start = min(group)
    came_from: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    walk = [start]
                    step: str | None = node
                    while step is not None:
                        walk.append(step)
                        step = came_from[step]
                    return walk[::-1]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def test_no_import_circles():
    """Every module imports only modules that do not import it back, however far round
    (docs/architecture/01-overview.md, "Layout"): a circle works only as long as each of its imports stays lazy."""
    circles = _cycles(_import_graph())
    assert not circles, "import circles:\n" + "\n".join(
        f"{' -> '.join(circle)} (one circle of {size} modules that import each other)" for circle, size in circles)


def test_the_circle_check_names_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert _cycles(graph) == [(["a", "b", "c", "a"], 3), (["e", "e2", "e"], 2)]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _too_long() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE.parent)
        source = path.read_text()
        lines = len(source.splitlines())
        if lines > MAX_FILE_LINES:
            problems.append(f"{where}: {lines} lines (at most {MAX_FILE_LINES})")
        if KERNELS in path.parents:
            continue
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    problems.append(f"{where}:{node.lineno}: {node.name} is {length} lines (at most "
                                    f"{MAX_FUNCTION_LINES})")
    return problems


def test_files_and_functions_stay_short():
    """Small files with one job: no module over 450 lines, no function over 80 outside the Pallas kernels."""
    problems = _too_long()
    assert not problems, "\n".join(problems)


def test_the_length_check_names_a_long_file_and_a_long_function(tmp_path):
    """The check itself can fail: a 451-line module holding an 81-line function is reported twice; the same
    function inside pallas_kernels/ only for its file."""
    fake = tmp_path / "vllm_jax"
    (fake / "pallas_kernels").mkdir(parents=True)
    long_function = "def f():\n" + "    x = 1\n" * 80
    long_module = long_function + "\n" * (MAX_FILE_LINES + 1 - long_function.count("\n"))
    (fake / "long.py").write_text(long_module)
    (fake / "pallas_kernels" / "kernel.py").write_text(long_function)
    global PACKAGE, KERNELS
    saved, PACKAGE, KERNELS = (PACKAGE, KERNELS), fake, fake / "pallas_kernels"
    try:
        problems = _too_long()
    finally:
        PACKAGE, KERNELS = saved
    assert problems == ["vllm_jax/long.py: 451 lines (at most 450)",
                        "vllm_jax/long.py:1: f is 81 lines (at most 80)"]


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


# ---- no module reaches into another's private attributes ----------------------------------------------------

# private name -> why a module outside the one defining it may still name it (`x._name`, or `from m import _name`)
PRIVATE_REACHES_ALLOWED = {
    "_SubParsersAction": "argparse's type of add_subparsers()'s result, named in the commands' annotations: the "
                         "stdlib has no public name for it",
    # the Pallas kernels (pallas_kernels/, not this check's slice) share these helpers with their sibling kernels
    **dict.fromkeys(("_CompilerParams", "_next_pow2", "_ANY", "_div", "_plgpu"),
                    "a Pallas kernel's helper its sibling kernel imports: to make public in pallas_kernels/"),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_privates(tree: ast.Module) -> set[str]:
    """The private names a module defines itself: its functions, classes, module and class-level assignments and
    attributes it sets on `self` / `cls` (setting one on another module's object defines nothing)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AnnAssign, ast.For)) else []
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    names.add(leaf.id)
                elif isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) \
                        and leaf.value.id in ("self", "cls"):
                    names.add(leaf.attr)
    return {name for name in names if _private(name)}


def _private_reaches() -> list[str]:
    """`x._name` where `_name` is not this module's own (x not self / cls / super()), and `from vllm_jax... import
    _name`, outside PRIVATE_REACHES_ALLOWED."""
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        own, where = _defined_privates(tree), path.relative_to(PACKAGE.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm_jax"):
                names = [alias.name for alias in node.names if _private(alias.name)]
            elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                value = node.value
                mine = isinstance(value, ast.Name) and value.id in ("self", "cls") or isinstance(value, ast.Call) \
                    and isinstance(value.func, ast.Name) and value.func.id == "super"
                names = [] if mine else [node.attr]
            else:
                continue
            problems += [f"{where}:{node.lineno}: {ast.unparse(node).splitlines()[0]} reaches into another module's "
                         f"private {name}" for name in names if name not in PRIVATE_REACHES_ALLOWED]
    return problems


def test_no_module_reaches_into_another_modules_private_attributes():
    """House style: a module uses another's public side (a property, a method, a public field), never its `_name`s
    (where the scheduler reads one per request per step, a public attribute: a property would be a call)."""
    assert _private_reaches() == []


def test_the_private_check_names_a_reach(tmp_path):
    """The check itself can fail: another object's `_secret` and an imported `_helper` are reported; the module's
    own `_count` on another instance, `self._x` and `super()._y` are not."""
    fake = tmp_path / "vllm_jax"
    fake.mkdir()
    (fake / "a.py").write_text("from vllm_jax.b import _helper\n\n\nclass A:\n    _count = 0\n\n"
                               "    def f(self, other, b):\n        self._x = other._count + super()._y\n"
                               "        return b._secret\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, fake
    try:
        problems = _private_reaches()
    finally:
        PACKAGE = saved
    assert [p.split(": ")[0] for p in problems] == ["vllm_jax/a.py:1", "vllm_jax/a.py:9"], problems
    assert "private _helper" in problems[0] and "private _secret" in problems[1]

"""The attention backend objects (vllm_jax/attention/): resolved once from --attention-backend and the platform,
and the only place that reads a backend's name is the resolver, so every other module asks the object."""

from __future__ import annotations

import ast
from pathlib import Path

from vllm_jax.attention import BACKENDS, attention_backend_for

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_jax"
RESOLVER = PACKAGE / "attention" / "selector.py"


def _names_in(node: ast.AST) -> list[str]:
    """Backend names spelled as string constants in `node` (a tuple / list / set of them included)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [item.value for item in items if isinstance(item, ast.Constant) and item.value in BACKENDS]


def _name_comparisons(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            names = [n for operand in (node.left, *node.comparators) for n in _names_in(operand)]
        elif isinstance(node, ast.Dict):
            names = [n for key in node.keys if key is not None for n in _names_in(key)]
        else:
            continue
        found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name!r}" for name in names]
    return found


def test_only_the_resolver_compares_backend_names():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != RESOLVER for hit in _name_comparisons(path)]
    assert not found, "backend names compared outside attention/selector.py (ask the backend object):\n" + \
        "\n".join(found)
    assert _name_comparisons(RESOLVER)  # the scan sees the resolver's own comparisons


def test_each_backend_owns_its_layout_and_table_width():
    xla, tpu, gpu = (attention_backend_for(name, "tpu" if name == "pallas_tpu" else "gpu") for name in BACKENDS)
    assert (xla.lane_dense, tpu.lane_dense, gpu.lane_dense) == (False, True, False)
    assert (xla.shard_mapped, tpu.shard_mapped, gpu.shard_mapped) == (False, True, True)
    assert (xla.block_table_width(9), tpu.block_table_width(9), gpu.block_table_width(9)) == (9, 128, 9)
    assert attention_backend_for("pallas_tpu", "cpu").block_table_width(9) == 9  # interpret mode: plain width
    assert xla.kernel_names(False) == () and gpu.kernel_names(False)[1] == "vllm_jax_write_kv_cache"


def test_resolving_twice_gives_the_same_static_object():
    """Models hold the backend in their graphdef: equal flags must give equal (and equally hashed) objects."""
    a, b = attention_backend_for("auto", "tpu"), attention_backend_for("pallas_tpu", "tpu")
    assert a == b and hash(a) == hash(b) and a.name == "pallas_tpu"
    assert attention_backend_for("pallas_tpu", "cpu") != a  # same name, another platform

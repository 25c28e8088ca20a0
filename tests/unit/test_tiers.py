"""The test tiers (tests/helpers/tiers.py): every module and test the table names exists (a renamed test would
silently fall back to its module's tier), and the session has the fake devices the multi-device tier runs on."""

from __future__ import annotations

import ast
from pathlib import Path

import jax

from tests.conftest import FAKE_CPU_DEVICES
from tests.helpers import tiers

TESTS = Path(__file__).resolve().parent


def _functions(module: str) -> set[str]:
    tree = ast.parse((TESTS / f"{module}.py").read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_every_module_and_test_the_table_names_exists():
    modules = tiers.UNIT_MODULES | tiers.MULTIDEVICE_MODULES | tiers.SERVED_MODULES
    assert not [m for m in modules if not (TESTS / f"{m}.py").is_file()]
    assert not [(m, f) for m, f in tiers.MULTIDEVICE_TESTS if f not in _functions(m)]
    assert not (tiers.UNIT_MODULES & tiers.SERVED_MODULES) and not (tiers.UNIT_MODULES & tiers.MULTIDEVICE_MODULES)


def test_the_session_has_fake_cpu_devices_and_one_device_work_stays_on_the_first():
    from vllm_jax.sharding.mesh import make_mesh

    assert jax.device_count() == FAKE_CPU_DEVICES
    assert list(make_mesh(tensor_parallel_size=1).devices.flat) == [jax.devices()[0]]
    assert jax.numpy.ones(3).devices() == {jax.devices()[0]}


def test_the_cpu_emitter_flag_is_set_only_where_jaxlib_registers_it(tmp_path):
    """jaxlib 0.11 dropped xla_cpu_use_fusion_emitters but still lists it among DebugOptions' reserved field
    names (followed by a protobuf tag byte); setting it there made XLA abort every test process in conftest."""
    from tests.helpers.xla_flags import registers_flag

    flag = "xla_cpu_use_fusion_emitters"
    registered, reserved = tmp_path / "registered.so", tmp_path / "reserved.so"
    registered.write_bytes(b"\0Dump LLVM IR.\0" + flag.encode() + b"\0other\0")
    reserved.write_bytes(b"\0xla_cpu_sparse_cuda_threadsR\x1b" + flag.encode() + b"R\x19xla_cpu_use_thunk_runtimeR")
    assert registers_flag(registered, flag) and not registers_flag(reserved, flag)
    assert not registers_flag(tmp_path / "missing.so", flag)

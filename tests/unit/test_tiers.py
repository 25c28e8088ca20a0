"""The test tiers: a test's tier is its module's folder (tests/conftest.py marks it), so every test module lives
in one of them, every tier has modules and is a registered marker; and the session has the fake devices the
multi-device tier runs on."""

from __future__ import annotations

import tomllib

import jax

from tests.conftest import FAKE_CPU_DEVICES, TESTS, TIERS, tier_of

REPO = TESTS.parent


def test_every_test_module_lives_in_a_tier_folder_and_every_tier_has_modules():
    modules = sorted(TESTS.rglob("test_*.py"))
    assert not [str(m.relative_to(REPO)) for m in modules if tier_of(m) is None]
    assert {tier: sum(tier_of(m) == tier for m in modules) > 0 for tier in TIERS} == dict.fromkeys(TIERS, True)
    assert all((TESTS / tier / "__init__.py").is_file() for tier in TIERS)
    assert tier_of(TESTS / "test_stray.py") is None and tier_of(TESTS / "helpers" / "test_stray.py") is None
    assert tier_of(TESTS / "engine" / "families" / "test_one.py") == "engine"


def test_each_tier_is_a_registered_marker():
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert set(TIERS) <= {marker.split(":")[0] for marker in markers}


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

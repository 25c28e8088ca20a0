"""The multi-device tests of tests/engine/test_aot_engine.py,
on the session's fake CPU devices (tests/conftest.py), with that module's fixtures and helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.engine.test_aot_engine import (
    tiny_dir,  # noqa: F401  (a fixture)
)


def test_tensor_parallel_programs_alias_each_devices_shard(tiny_dir, tmp_path):  # noqa: F811
    """cpu:2 with -tp 2 (fake CPU devices, a subprocess): every forward aliases the cache's per-device half."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu",  # the session's flags (tests/conftest.py) and two devices
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"}
    out = tmp_path / "tp.json"
    proc = subprocess.run([sys.executable, "-m", "vllm_jax.cli", "compile-check", str(tiny_dir), "--target",
                           "cpu:2", "-tp", "2", "--json", str(out), "--max-num-batched-tokens", "8",
                           "--max-num-seqs", "8", "--max-model-len", "256"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [result] = json.loads(out.read_text())
    budget = result["budget"]
    assert budget["bytes_per_block"] * 2 == 2 * 16 * 2 * 2 * 16 * 4  # layers x block x K/V x heads x dim x f32
    assert all(p["report"]["memory"]["alias_size_in_bytes"] == budget["kv_bytes"]
               for p in result["programs"] if p["kind"] == "forward")

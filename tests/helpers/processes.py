"""The subprocess idiom of the tests whose subject is a process (the benchmark scripts, engines restarted over a
compilation cache, the two jax.distributed processes): run python from the repository root, read its JSON line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def unoptimized(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (None: this process's environment) with XLA's optimizations off, as in the test process
    (tests/conftest.py): these processes are tested for what they do (restarts over a cache, two jax processes, a
    benchmark's report, a drain on SIGTERM), not for the speed of their programs; programs compiled optimized are
    checked by tests/served/test_default_model.py, .ci/smoke and .ci/aot_check."""
    return {**(os.environ if env is None else env), "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}


def run_python(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python ARGS` in the repository root (so `benchmarks/...` and `tests.helpers...` resolve), its output
    captured, XLA's optimizations off (`unoptimized`); fails the test with the output's tail unless it exits 0."""
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=unoptimized(env))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def last_json(stdout: str) -> Any:
    """The JSON object a script printed last (libraries may print before it)."""
    return json.loads(stdout.strip().splitlines()[-1])


def run_two_jax_processes(module: str, *args: str, timeout: float = 600) -> str:
    """`python -m module RANK PORT *args` as ranks 0 and 1 of one jax.distributed job on 127.0.0.1 (compiled
    unoptimized); both must exit 0. -> rank 0's stdout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-m", module, str(rank), str(port), *args], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=unoptimized())
             for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
    return outs[0][0]

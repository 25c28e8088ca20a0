"""Where the suite's time goes: jax's compile events summed per test module, written when a worker ends.

Opt-in (`VLLM_JAX_COMPILE_REPORT=DIR python -m pytest ...`): each pytest process writes DIR/<pid>.json with, per
module, its wall seconds and the seconds jax spent tracing, lowering and compiling (jax.monitoring's duration events,
which also fire for the engine's ahead-of-time programs), and per compiled function its seconds and count.
`python -m tests.helpers.compile_report DIR` prints both tables, largest first
(docs/contributing/testing.md, "Compile time")."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
           "/jax/core/compile/backend_compile_duration": "compile"}


class CompileReport:
    """A pytest plugin: attributes each compile event to the module of the test that was running."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.current = "(collection)"
        self.totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.started = 0.0
        from jax import monitoring

        monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, fun_name: str = "?", **_: object) -> None:
        kind = _EVENTS.get(event)
        if kind is not None:
            self.totals[self.current][kind] += duration
            self.totals[self.current]["programs"] += kind == "compile"
        if kind == "compile":
            self.totals[f"fn {fun_name}"]["compile"] += duration
            self.totals[f"fn {fun_name}"]["programs"] += 1

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self.current = nodeid.split("::")[0]
        self.started = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        self.totals[self.current]["wall"] += time.monotonic() - self.started

    def pytest_sessionfinish(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"{os.getpid()}.json").write_text(json.dumps(self.totals))


def main(out_dir: str) -> None:
    merged: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for path in Path(out_dir).glob("*.json"):
        for module, kinds in json.loads(path.read_text()).items():
            for kind, value in kinds.items():
                merged[module][kind] += value
    functions = sorted(((m, k) for m, k in merged.items() if m.startswith("fn ")), key=lambda kv: -kv[1]["compile"])
    rows = sorted(((m, k) for m, k in merged.items() if not m.startswith("fn ")), key=lambda kv: -kv[1]["wall"])
    print(f"{'module':48} {'wall s':>8} {'compile':>8} {'lower':>7} {'trace':>7} {'programs':>8}")
    for module, k in rows:
        print(f"{module:48} {k['wall']:8.1f} {k['compile']:8.1f} {k['lower']:7.1f} {k['trace']:7.1f} "
              f"{int(k['programs']):8d}")
    total = {kind: sum(k[kind] for _, k in rows) for kind in ("wall", "compile", "lower", "trace", "programs")}
    print(f"{'total':48} {total['wall']:8.1f} {total['compile']:8.1f} {total['lower']:7.1f} {total['trace']:7.1f} "
          f"{int(total['programs']):8d}")
    print(f"\n{'compiled function (top 25)':48} {'compile':>8} {'programs':>8}")
    for name, k in functions[:25]:
        print(f"{name[3:][:48]:48} {k['compile']:8.1f} {int(k['programs']):8d}")


if __name__ == "__main__":
    main(sys.argv[1])

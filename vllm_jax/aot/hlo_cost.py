"""Flops and bytes of a compiled program where the executable reports no cost analysis (XLA:GPU's compile-only
executables report none).

XLA's generic HloCostAnalysis runs over the optimized module: the fusions, GEMMs and copies XLA:GPU chose, each
counted by the bytes it reads and writes. It cannot see into a custom call, so a Pallas Triton call counts
nothing here and the kernels' own pl.CostEstimates stand in for them (aot.compile adds those). Like every XLA
cost analysis it counts a while loop's body once: a layer-scanned model's figures hold one layer.
"""

from __future__ import annotations

from typing import Any


def generic_cost(compiled: Any) -> tuple[float, float] | None:
    """(flops, bytes accessed) of `compiled`'s optimized module; None when jaxlib does not expose the analysis."""
    try:
        from jax._src import xla_bridge
        from jax._src.lib import _jax

        module = compiled.runtime_executable().hlo_modules()[0]
        cost = _jax.hlo_module_cost_analysis(xla_bridge.get_backend("cpu"), module)
    except Exception:  # noqa: BLE001 - a private jaxlib entry point: absent or changed in another version
        return None
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))

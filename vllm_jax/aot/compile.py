"""Compile a jitted function for a chip this host does not have, and say what came out.

`compile_for_target(fn, args, "v5e:1x1")` lowers and compiles `fn` on abstract inputs (ShapeDtypeStructs) for
the target's compile-only devices: real XLA:TPU + Mosaic or XLA:GPU + Triton, with the chip's VMEM, SMEM and
shared-memory limits enforced, so an oversized kernel fails here as it would on the chip. The report says
whether it compiled (and the compiler's message if not), how long compiling took, whether the compiled program
really contains the Pallas kernels (a silent fallback to XLA ops must not pass), XLA's memory analysis, the
flops and bytes of XLA's cost analysis next to the kernels' own `pl.CostEstimate`s (XLA:GPU does not see
those), and a roofline time from the chip's public peak figures.

The lowering runs under `jax.set_mesh` of the target's devices, so code that asks which chip it is built for
(Pallas's TPU lowering, the kernels' VMEM / shared-memory budgets: vllm_jax.aot.targets.current_chip) sees
the target and not this host's CPU.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core

from vllm_jax.aot.hlo_cost import generic_cost
from vllm_jax.aot.targets import Target, get_target

# What a Pallas kernel becomes in compiled HLO.
KERNEL_MARKERS = {"tpu": 'custom_call_target="tpu_custom_call"', "gpu": 'custom_call_target="__gpu$xla.gpu.triton"'}
# XLA:TPU's cost analysis adds each Mosaic call's pl.CostEstimate; XLA:GPU's has none for Triton calls (and
# jax's Triton lowering drops the estimate), so there the kernels' own estimates are added to aot.hlo_cost's.
KERNEL_COSTS_IN_XLA = {"tpu": True, "gpu": False, "cpu": False}


@dataclasses.dataclass
class CompileReport:
    target: str
    ok: bool
    error: str | None = None
    compile_seconds: float = 0.0
    # this process's CPU seconds over the same span: what the compile cost, whatever else loads the machine (XLA
    # compiles a program on one core)
    compile_cpu_seconds: float = 0.0
    kernel_calls: int = 0  # Pallas custom calls in the compiled program
    kernel_names: tuple[str, ...] = ()
    memory: dict[str, int] = dataclasses.field(default_factory=dict)
    xla_flops: float = 0.0
    xla_bytes_accessed: float = 0.0
    kernel_flops: int = 0  # sum of the pallas_calls' CostEstimates (traced once each)
    kernel_bytes_accessed: int = 0
    flops: float = 0.0  # what the roofline counts: XLA's, plus the kernels' where XLA does not see them
    bytes_accessed: float = 0.0
    roofline_seconds: float = 0.0
    # "xla": the compiled executable's own cost analysis; "generic": XLA's HloCostAnalysis over the optimized
    # module (aot.hlo_cost), where the executable has none. Either counts a while loop's body once.
    cost_source: str = "xla"

    @property
    def kernel_present(self) -> bool:
        return self.kernel_calls > 0

    def summary(self) -> str:
        if not self.ok:
            return f"{self.target}: FAILED {self.error.splitlines()[0] if self.error else ''}"
        return (f"{self.target}: ok in {self.compile_seconds:.1f}s, {self.kernel_calls} kernel call(s) "
                f"{sorted(set(self.kernel_names))}, temp {self.memory.get('temp_size_in_bytes', 0) / 2**20:.1f} MiB,"
                f" kernel flops {self.kernel_flops:.3g}, bytes {self.kernel_bytes_accessed:.3g}, "
                f"roofline {self.roofline_seconds * 1e6:.1f} us")


def place(args: Any, target: Target, shardings: Any = None) -> Any:
    """ShapeDtypeStructs on the target's devices: `shardings` (a matching pytree of Shardings or
    PartitionSpecs over target.mesh()) or, by default, all on the first device."""
    mesh = target.mesh()
    one = jax.sharding.SingleDeviceSharding(target.devices[0])

    def put(leaf, sharding=None):
        if sharding is None:
            sharding = one
        elif isinstance(sharding, jax.sharding.PartitionSpec):
            sharding = jax.sharding.NamedSharding(mesh, sharding)
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    if shardings is None:
        return jax.tree.map(put, args)
    return jax.tree.map(put, args, shardings,
                        is_leaf=lambda x: isinstance(x, (jax.ShapeDtypeStruct, jax.sharding.PartitionSpec)))


def _kernel_costs(jaxpr: jax.extend.core.Jaxpr) -> tuple[int, int]:
    """Flops and bytes of every pallas_call's CostEstimate in a jaxpr, inside jit/shard_map/cond bodies too (a
    scan's body counted `length` times; a while loop's once)."""
    flops = bytes_accessed = 0

    def walk(jaxpr, times):
        nonlocal flops, bytes_accessed
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                cost = eqn.params.get("cost_estimate")
                if cost is not None:
                    flops += times * cost.flops
                    bytes_accessed += times * cost.bytes_accessed
                continue
            inner = times * eqn.params["length"] if eqn.primitive.name == "scan" else times
            for sub in _subjaxprs(eqn):
                walk(sub, inner)

    walk(jaxpr, 1)
    return flops, bytes_accessed


def _subjaxprs(eqn):
    for value in eqn.params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, jax.extend.core.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jax.extend.core.Jaxpr):
                yield v


def compile_for_target(fn: Callable, args: tuple, target: str | Target, *, shardings: Any = None,
                       donate_argnums: tuple[int, ...] = ()) -> CompileReport:
    """Lower and compile `jax.jit(fn)(*args)` for `target`; never raises for a compile failure (see .error)."""
    target = get_target(target) if isinstance(target, str) else target
    report, _ = compile_jitted(jax.jit(fn, donate_argnums=donate_argnums), place(args, target, shardings), target)
    return report


def compile_jitted(jitted: Any, args: tuple, target: Target, mesh: jax.sharding.Mesh | None = None,
                   compiler_options: dict[str, Any] | None = None) -> tuple[CompileReport, Any]:
    """Trace, lower and compile an already jitted function (its own donation and static arguments) on abstract
    `args` placed on the target's devices, under `mesh` (default: the target's whole mesh) so the kernels plan
    for the target's chip; `compiler_options`: XLA flags for this compile. -> (report, the compiled executable
    or None). A failure, the kernel plan's refusal
    (a ValueError while tracing) included, is the report's `error`, never an exception."""
    report = CompileReport(target=target.name, ok=False)
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        with jax.set_mesh(mesh or target.mesh()):
            traced = jitted.trace(*args)
            compiled = traced.lower().compile(compiler_options)
    except Exception as exc:  # noqa: BLE001 - the compiler's (or the kernel plan's) own message is the point
        report.compile_seconds = time.perf_counter() - start
        report.compile_cpu_seconds = time.process_time() - cpu_start
        report.error = f"{type(exc).__name__}: {exc}"
        return report, None
    report.compile_seconds = time.perf_counter() - start
    report.compile_cpu_seconds = time.process_time() - cpu_start
    report.ok = True
    report.kernel_flops, report.kernel_bytes_accessed = _kernel_costs(traced.jaxpr.jaxpr)
    _read_compiled(report, compiled, target)
    return report, compiled


def _read_compiled(report: CompileReport, compiled: Any, target: Target) -> None:
    """The kernels in the compiled text, XLA's memory and cost analyses, and the roofline."""
    text = compiled.as_text() or ""
    marker = KERNEL_MARKERS.get(target.platform)  # none on CPU: interpret mode leaves no custom call
    calls = [line for line in text.splitlines() if marker and marker in line]
    report.kernel_calls = len(calls)
    report.kernel_names = tuple(m.group(1) for line in calls
                                for m in [re.search(r'op_name="[^"]*?(vllm_jax_\w+|[\w.]+)/pallas_call', line)] if m)
    memory = compiled.memory_analysis()
    if memory is not None:
        report.memory = {f: int(getattr(memory, f)) for f in ("argument_size_in_bytes", "output_size_in_bytes",
                                                              "alias_size_in_bytes", "temp_size_in_bytes",
                                                              "generated_code_size_in_bytes")}
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if cost:
        report.xla_flops = float(cost.get("flops", 0.0))
        report.xla_bytes_accessed = float(cost.get("bytes accessed", 0.0))
    elif (generic := generic_cost(compiled)) is not None:  # XLA:GPU compile-only: no cost analysis
        report.xla_flops, report.xla_bytes_accessed = generic
        report.cost_source = "generic"
    report.flops, report.bytes_accessed = report.xla_flops, report.xla_bytes_accessed
    if not KERNEL_COSTS_IN_XLA[target.platform]:
        report.flops += report.kernel_flops
        report.bytes_accessed += report.kernel_bytes_accessed
    report.roofline_seconds = target.spec.roofline_seconds(report.flops, report.bytes_accessed)  # per device

"""Every program the engine's warm-up compiles, compiled for a chip this host does not have.

`check_target(args, "v5e:2x2")` takes the engine's own path: `args.create_config(platform=...)` (the target's
defaults: dtype, batch limits, buckets, attention backend), `worker.engine_builder.build_engine(...,
abstract=True)` (the runner's own construction: its model, params, speculator and block-table width, abstract, and
every refusal of the runner), and warm-up's plan (worker/compilation.py: each token bucket's forward,
the KV write inside it, each sampler variant per sequence bucket), every program compiled by
`aot.compile.compile_jitted` through the DeviceStep's own jitted functions (their donation included).

The KV cache is sized by the engine's accelerator rule (worker/kv_budget.py, `sized_by_probes`): the largest
bucket's samplers first (they read no cache, compiled for the logits layout the forward will have), the cache
sized for their temporaries, then the largest bucket's forward at that cache (sized again only if it needs more);
the plan is then compiled at that cache, those programs reused. A config that cannot fit (the weights, one
max_model_len request, a kernel plan's VMEM / SMEM refusal) ends in its message naming the flag, as at start-up.
`aot.checks` says what must hold of the result.
"""

from __future__ import annotations

import re
from typing import Any

import jax

from vllm_jax.aot.checks import check
from vllm_jax.aot.compile import CompileReport, compile_jitted
from vllm_jax.aot.results import ProgramResult, TargetResult
from vllm_jax.aot.targets import Target, get_target
from vllm_jax.config import EngineArgs
from vllm_jax.model.mla_spec import MlaSpec
from vllm_jax.worker.compilation import WarmupPlan
from vllm_jax.worker.device_step import DeviceStep
from vllm_jax.worker.engine_builder import DeviceStepFactory, EngineParts, build_engine
from vllm_jax.worker.kv_budget import KVBudget, kv_budget, sized_by_probes


class _ProgramFailed(Exception):
    """A program did not compile; its report already holds the compiler's message."""


class _Recorder:
    """Compiles what the DeviceStep asks for (via `RecordingDeviceStep`) and keeps one result per plan label."""

    def __init__(self, target: Target, mesh: jax.sharding.Mesh, compiler_options: dict[str, Any] | None = None):
        self.target, self.mesh, self.compiler_options = target, mesh, compiler_options
        self.label = ""
        self.results: dict[str, ProgramResult] = {}
        self._compiled: dict[tuple, tuple[CompileReport, Any]] = {}  # by program and argument avals

    def compile(self, key: tuple, jitted: Any, args: tuple) -> Any:
        avals = (key, tuple(_aval(x) for x in jax.tree.leaves(args)))
        reused = avals in self._compiled
        if not reused:
            self._compiled[avals] = compile_jitted(jitted, args, self.target, self.mesh,
                                                  self.compiler_options)
        report, compiled = self._compiled[avals]
        self.results[self.label] = _result(self.label, report, reused)
        if compiled is None:
            raise _ProgramFailed(report.error)
        return compiled

    def compile_seconds(self) -> tuple[float, float]:
        """Wall and CPU seconds of every compile so far, each program once."""
        reports = [report for report, _ in self._compiled.values()]
        return sum(r.compile_seconds for r in reports), sum(r.compile_cpu_seconds for r in reports)

    def run(self, plan: list) -> list[ProgramResult]:
        """Every (label, make-ready) of a warm-up plan; a failure is recorded and the rest still compile."""
        labels = []
        for label, make_ready in plan:
            self.label = label
            labels.append(label)
            try:
                make_ready()
            except _ProgramFailed:
                pass
            except Exception as exc:  # noqa: BLE001 - e.g. a kernel plan's refusal while tracing, or a sampler without logits
                failed = CompileReport(target=self.target.name, ok=False, error=f"{type(exc).__name__}: {exc}")
                self.results[label] = _result(label, failed, False)
        return [self.results[label] for label in labels]


class RecordingDeviceStep(DeviceStep):
    """The engine's DeviceStep whose warm-up compiles for the target and records what came out."""

    def __init__(self, *args, recorder: _Recorder, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorder = recorder

    def load_or_compile(self, key: tuple, jitted: Any, args: tuple, dynamic_args: tuple, outputs: Any) -> Any:
        return self.recorder.compile(key, jitted, args)


def check_target(args: EngineArgs, target: str | Target) -> TargetResult:
    """Compile every warm-up program of `args` for `target` (see the module docstring); never raises for a
    config the target cannot run (TargetResult.refused) or a program that does not compile (its report)."""
    target = get_target(target) if isinstance(target, str) else target
    config = args.create_config(platform=target.platform)
    mc, sc = config.model_config, config.scheduler_config
    result = TargetResult(target.name, target.platform, config.parallel_config.tensor_parallel_size,
                          config.resolved_attention_backend.name, mc.dtype, mc.max_model_len, sc.max_num_seqs,
                          sc.max_num_batched_tokens, config.cache_config.block_size, scan_layers=config.scan_layers,
                          kv_cache_dtype=mc.kv_cache_dtype)
    try:
        engine = build_engine(config, target.devices, abstract=True)
    except ValueError as exc:  # what the runner refuses (a tensor-parallel layout the kernels cannot serve, an
        # expert count tp does not divide, ...), too few devices
        result.refused = str(exc)
        return result
    result.num_layers = engine.spec.num_layers
    result.mla = isinstance(engine.spec, MlaSpec)
    result.target_kv_bytes_per_block = engine.target_kv_bytes_per_block
    recorder = _Recorder(target, engine.mesh)

    def budget(temp_bytes: int) -> KVBudget | None:
        try:
            return kv_budget(config, target.engine_memory_bytes, engine.weight_bytes, temp_bytes,
                             engine.kv_bytes_per_block)
        except ValueError as exc:  # the message names the flag, as at start-up
            result.refused = str(exc)
            return None

    if budget(0) is None:  # the weights alone, or an explicit budget, leave no room: nothing to compile
        return result
    largest = engine.buckets()[-1:]
    num_seqs = largest[0][1]

    def probe(num_blocks: int, kinds: tuple[str, ...], logits_for: dict) -> int:
        programs = compile_plan(engine, target, num_blocks, largest, kinds=kinds, recorder=recorder,
                                logits_for=logits_for)
        if not all(p.report.ok for p in programs):
            raise _ProbeStopped(programs)
        return max((p.report.memory.get("temp_size_in_bytes", 0) for p in programs), default=0)  # pooling: no sampler

    def blocks_for(temp_bytes: int) -> int:
        result.budget = budget(temp_bytes)
        if result.budget is None:
            raise _ProbeStopped([])
        return result.budget.num_blocks

    try:
        sized_by_probes(blocks_for,
                        lambda: probe(engine.min_blocks(), ("sampler",),
                                      {num_seqs: engine.predicted_logits(num_seqs)}),
                        lambda num_blocks: probe(num_blocks, tuple(k for k in KINDS if k != "sampler"), {}))
    except _ProbeStopped as stopped:
        result.compile_seconds, result.compile_cpu_seconds = recorder.compile_seconds()
        if not stopped.programs:
            return result  # refused: the message names the flag
        result.programs = stopped.programs
        return check(result)
    result.programs = compile_plan(engine, target, result.budget.num_blocks, recorder=recorder)
    result.compile_seconds, result.compile_cpu_seconds = recorder.compile_seconds()
    return check(result)


class _ProbeStopped(Exception):
    """The KV probe cannot go on: a program failed (`programs`, to report) or the budget refused (none)."""

    def __init__(self, programs: list[ProgramResult]):
        super().__init__()
        self.programs = programs


# every kind of program warm-up makes ready
KINDS = ("forward", "sampler", "token", "draft", "lora", "pooler", "vision", "multistep")


def engine_plan(engine: EngineParts, num_blocks: int, buckets: list | None = None, *, kinds: tuple[str, ...] = KINDS,
                device_step: DeviceStepFactory = DeviceStep, logits_for: dict | None = None) -> WarmupPlan:
    """Warm-up's plan over `engine`'s abstract step with a `num_blocks` cache (`buckets`: EngineParts.compilation's),
    its `kinds` of programs: what `compile_plan` compiles. `logits_for`: CompilationManager.plan's."""
    plan = engine.compilation(num_blocks, buckets, device_step=device_step).plan(logits_for)
    return [item for item in plan if item[0].split()[0] in kinds]


def compile_plan(engine: EngineParts, target: Target, num_blocks: int, buckets: list | None = None, *,
                 kinds: tuple[str, ...] = KINDS, recorder: _Recorder | None = None,
                 compiler_options: dict[str, Any] | None = None, logits_for: dict | None = None
                 ) -> list[ProgramResult]:
    """Compile `engine_plan` for `target` (with `compiler_options`, XLA flags, when no `recorder` is given). A
    shared `recorder` compiles a program it has seen with the same inputs once."""
    recorder = recorder or _Recorder(target, engine.mesh, compiler_options)
    step = lambda *a, **k: RecordingDeviceStep(*a, recorder=recorder, **k)  # noqa: E731
    return recorder.run(engine_plan(engine, num_blocks, buckets, kinds=kinds, device_step=step,
                                    logits_for=logits_for))


def _result(label: str, report: CompileReport, reused: bool) -> ProgramResult:
    tokens = re.search(r"\bT=(\d+)", label)
    seqs = re.search(r"\bS=(\d+)", label)
    return ProgramResult(label, label.split()[0], int(tokens.group(1)) if tokens else None,
                         int(seqs.group(1)) if seqs else 0, report, reused)


def _aval(x: Any) -> tuple:
    if hasattr(x, "shape"):
        return tuple(x.shape), str(x.dtype), str(getattr(x, "sharding", None))
    return (repr(x),)

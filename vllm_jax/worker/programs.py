"""The program base every compiled step builds on: its executable cache, load-or-compile, and trace count.

A step (the engine's DeviceStep, a draft model's or an EAGLE-3 head's, the pooling programs, the vision encoder,
the multi-step chunk program) keeps one compiled executable per (program, input signature). Warm-up makes each
ready (`make_ready`): loaded from the ProgramStore when it has it, else lowered, compiled and stored; a call then
runs the executable of its shapes (`program`), or the jitted function, which traces and compiles on first use.
Every trace reports itself (`on_trace`), so the compilation manager counts them (docs/architecture/05-worker.md,
"Compilation and warm-up").

A step attached to the engine's step compiles through that step's `load_or_compile` (`compile_with`), so
compile-check, which records the engine step's compiles for a target, records theirs too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vllm_jax.worker.compilation_cache import ProgramStore, count_cache_lookups

# (key, jitted, args, dynamic args, outputs-shaped pytree) -> executable: CompiledPrograms.load_or_compile
LoadOrCompile = Callable[[tuple, Any, tuple, tuple, Any], Any]


def _no_trace() -> None:
    return None


class CompiledPrograms:
    """A step's compiled programs on `mesh` (see the module docstring). `store`: the compilation cache's program
    store (None: off); `compile_with`: another step's load_or_compile to compile through (an attached step's)."""

    def __init__(self, mesh: Mesh, *, store: ProgramStore | None = None,
                 on_trace: Callable[[], None] = _no_trace, compile_with: LoadOrCompile | None = None):
        self.store, self.on_trace = store, on_trace
        self.devices = list(mesh.devices.flat)  # what every program runs on (a stored one is loaded onto them)
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.to_device = replicator(self.replicated)  # numpy -> global arrays with several processes
        self._compile_with = compile_with
        self._executables: dict[tuple, Any] = {}  # (program, input signature) -> compiled executable
        # freshly compiled programs' pytree structures, so a step adopting them can store them (adopt_programs)
        self._fresh: dict[tuple, tuple] = {}

    def program(self, key: tuple, jitted: Any) -> Any:
        """The executable warm-up made ready for `key`, else `jitted` (which compiles on first use)."""
        return self._executables.get(key, jitted)

    def is_ready(self, key: tuple) -> bool:
        return key in self._executables

    def executable(self, key: tuple) -> Any:
        """The ready executable of `key` (KeyError: warm-up did not make it)."""
        return self._executables[key]

    def make_ready(self, key: tuple, jitted: Any, args: tuple, dynamic_args: tuple, outputs: Any) -> Any:
        """Warm-up: the executable of `key`, made ready once (see load_or_compile)."""
        if key not in self._executables:
            self._executables[key] = self.load_or_compile(key, jitted, args, dynamic_args, outputs)
        return self._executables[key]

    def keep(self, key: tuple, executable: Any) -> None:
        """Record an executable made ready elsewhere (compiled side by side: DeviceStep.precompile_forwards)."""
        self._executables[key] = executable

    @property
    def executables(self) -> list:
        """The compiled (or loaded) programs warm-up made ready."""
        return list(self._executables.values())

    def load_or_compile(self, key: tuple, jitted: Any, args: tuple, dynamic_args: tuple, outputs: Any) -> Any:
        """The executable for `key`: loaded from the store, else compiled (and stored when freshly compiled).

        `outputs`: any pytree shaped like the program's outputs, to rebuild the executable's pytrees on load."""
        if self._compile_with is not None:
            return self._compile_with(key, jitted, args, dynamic_args, outputs)
        executable = self.load_stored(key, dynamic_args, outputs)
        if executable is None:
            with count_cache_lookups() as jax_cache:
                executable = jitted.lower(*args).compile()
            # Only a fresh compile is stored: on CPU, an executable jax read back from its own cache serializes
            # without its kernels ("Function ... not found" once loaded). jax's cache serves that program anyway.
            if jax_cache.hits == 0:
                self._fresh[key] = program_trees(dynamic_args, outputs)
                self.store_compiled(key, executable, dynamic_args, outputs)
        return executable

    def load_stored(self, key: tuple, dynamic_args: tuple, outputs: Any) -> Any | None:
        """The stored executable for `key` (None: no store, or a miss)."""
        if self.store is None:
            return None
        return self.store.load(key[0], repr(key[1:]), program_trees(dynamic_args, outputs), self.devices)

    def store_compiled(self, key: tuple, executable: Any, dynamic_args: tuple, outputs: Any) -> None:
        if self.store is not None:
            self.store.save(key[0], repr(key[1:]), executable, program_trees(dynamic_args, outputs))

    def adopt_programs(self, other: CompiledPrograms, wanted: Callable[[tuple], bool]) -> None:
        """Take `other`'s ready programs whose key is `wanted` and that this step lacks; the fresh compiles among
        them are stored in this step's compilation cache, as its own would be."""
        for key, executable in other._executables.items():
            if key in self._executables or not wanted(key):
                continue
            self._executables[key] = executable
            if key in other._fresh and self.store is not None:
                self.store.save(key[0], repr(key[1:]), executable, other._fresh[key])


def program_trees(dynamic_args: tuple, outputs: Any) -> tuple:
    """An executable's (inputs, outputs) pytree structures, which the store rebuilds it with."""
    return jax.tree.structure((dynamic_args, {})), jax.tree.structure(outputs)


def input_signature(tree: Any) -> tuple:
    """What picks a compiled program: the pytree's structure and each leaf's shape and dtype. Run several times a
    step: the dtype objects themselves (hashable, equal across numpy and jax), since str(dtype) cost ten times
    the rest."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(x.shape), x.dtype) for x in leaves)


def replicator(sharding: NamedSharding) -> Callable[[Any], Any]:
    """numpy -> arrays replicated over the mesh (global arrays, as multi-process jit requires)."""
    if jax.process_count() == 1:
        return lambda tree: tree
    return lambda tree: jax.tree.map(
        lambda x: jax.make_array_from_callback(np.shape(x), sharding, lambda idx, x=np.asarray(x): x[idx]),  # noqa: B008
        tree)  # (the default binds this leaf's host copy, once)


def fetch_to_host(tree: Any) -> Any:
    """Host copies of (replicated) results; with several processes each reads its own addressable copy."""
    def one(a):
        if isinstance(a, jax.Array) and not a.is_fully_addressable:
            return np.asarray(a.addressable_data(0))
        return np.asarray(a)

    return jax.tree.map(one, tree)

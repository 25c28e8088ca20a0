"""Compiled programs persist on disk by default, in a per-user directory, so a restart is fast.

A first start compiles every program warm-up needs; the next start reads them back instead. vLLM and
tpu-inference cache their compiled programs by default the same way. The directory is
`$VLLM_JAX_CACHE_ROOT/compile` (default root: `$XDG_CACHE_HOME/vllm_jax`, i.e. `~/.cache/vllm_jax`);
`--compilation-cache-dir` moves it, `--no-compilation-cache` or vLLM's `VLLM_DISABLE_COMPILE_CACHE=1` turns it
off. It holds two stores:
- `programs/`: warm-up's executables, loaded directly at the next start (`ProgramStore`: no tracing, lowering or
  compiling at all);
- `xla/`: jax's persistent compilation cache, for any program compiled later (prompt logprobs, odd shapes).

jax's cache directory is process-wide and jax reads it once, at the first compile; `use_compilation_cache` resets
jax's cache object when an engine asks for another directory than the one in use, so several engines in one
process (tests) each get the directory they asked for.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_MISS_EVENT = "/jax/compilation_cache/cache_misses"


def use_compilation_cache(path: str | None) -> str | None:
    """Point jax's persistent cache at `path`/xla (every program cached, however fast it compiled).

    Returns the directory in use, or None when there is none: `path` is None, or it cannot be created (a
    read-only home directory is a warning, never a failed start)."""
    if path is None:
        return None
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    xla_dir = os.path.join(path, "xla")
    try:
        os.makedirs(xla_dir, exist_ok=True)
    except OSError as exc:
        logger.warning("compilation cache disabled: cannot create %s (%s)", xla_dir, exc)
        return None
    if jax.config.jax_compilation_cache_dir != xla_dir:
        jax.config.update("jax_compilation_cache_dir", xla_dir)
        compilation_cache.reset_cache()  # jax caches its cache object at the first compile
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


@dataclass
class CacheCounts:
    hits: int = 0
    misses: int = 0


@contextmanager
def count_cache_lookups() -> Iterator[CacheCounts]:
    """Count the persistent-cache hits and misses of the compiles inside the block (jax's monitoring events)."""
    import jax

    counts = CacheCounts()

    def listener(event: str, **_: object) -> None:
        if event == _HIT_EVENT:
            counts.hits += 1
        elif event == _MISS_EVENT:
            counts.misses += 1

    jax.monitoring.register_event_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_listener(listener)


def _source_digest() -> str:
    """A digest of vllm_jax's own source (and its native kernels'): a stored program is only reused by the code that
    compiled it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the vllm_jax package
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith((".py", ".cc", ".h")):  # .cc / .h: the native kernels' sources (native/)
                path = os.path.join(dirpath, name)
                digest.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()


class ProgramStore:
    """Warm-up's compiled executables on disk, so a restart loads them without tracing, lowering or compiling.

    jax's persistent cache still traces and lowers every program before it can look it up; this store skips that.
    An executable is filed under a namespace that digests
    everything that shapes it: vllm_jax's source, the jax and jaxlib versions, the devices it runs on, XLA's flags (and
    jax's `jax_disable_most_optimizations`, which the test suite sets),
    and the caller's fingerprint (model config, dtypes, KV-cache and param shapes and shardings), then under its
    program name and input signature. A change to any of them is a miss, never a stale program. The store is as
    trusted as jax's own cache (both hold native code): keep it in a directory only you can write. The
    `MAX_NAMESPACES` most recently used namespaces are kept; older ones are deleted.
    """

    MAX_NAMESPACES = 8

    def __init__(self, root: str, fingerprint: Sequence[str]):
        import jax
        import jaxlib

        parts = [_source_digest(), jax.__version__, jaxlib.__version__, os.environ.get("XLA_FLAGS", ""),
                 os.environ.get("LIBTPU_INIT_ARGS", ""), str(jax.config.values.get("jax_disable_most_optimizations")),
                 *fingerprint]
        namespace = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
        self.base = os.path.join(root, "programs")
        self.dir = os.path.join(self.base, namespace)
        self.loaded = self.saved = 0

    def load(self, name: str, signature: str, trees: tuple[Any, Any], devices: Sequence[Any]) -> Any | None:
        """The stored executable loaded onto `devices` (the ones it was compiled for), or None on a miss; a corrupt
        entry is dropped. `trees`: its (inputs, outputs) pytree structures, which the caller rebuilds from the call
        (the file holds only jax's serialized executable, no pickled Python objects of ours)."""
        from jax.experimental import serialize_executable

        path = self._path(name, signature)
        try:
            with open(path, "rb") as f:
                payload = f.read()
            executable = serialize_executable.deserialize_and_load(payload, *trees, execution_devices=devices)
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - truncated or foreign file: compile instead
            logger.warning("dropping unreadable stored program %s (%s: %s)", path, type(exc).__name__, exc)
            with contextlib.suppress(OSError):
                os.remove(path)
            return None
        self.loaded += 1
        return executable

    def save(self, name: str, signature: str, executable: Any, trees: tuple[Any, Any]) -> None:
        """Write atomically (a crash leaves no half file); a full disk is a warning, never a failed start.

        Stored only if `trees` are the executable's own pytree structures, so that `load` rebuilds them right."""
        from jax.experimental import serialize_executable

        path = self._path(name, signature)
        try:
            payload, in_tree, out_tree = serialize_executable.serialize(executable)
            if (in_tree, out_tree) != trees:
                logger.warning("not storing %s: its pytrees differ from the call's (%s)", name, (in_tree, out_tree))
                return
            os.makedirs(self.dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            os.replace(tmp, path)
        except Exception as exc:  # noqa: BLE001 - e.g. disk full, or an executable that cannot serialize
            logger.warning("could not store compiled program %s (%s: %s)", name, type(exc).__name__, exc)
            return
        self.saved += 1

    def touch_and_prune(self) -> None:
        """Mark this namespace used now; delete all but the MAX_NAMESPACES most recently used."""
        try:
            os.makedirs(self.dir, exist_ok=True)
            os.utime(self.dir)
            spaces = sorted((e for e in os.scandir(self.base) if e.is_dir()), key=lambda e: e.stat().st_mtime,
                            reverse=True)
        except OSError:
            return
        for old in spaces[self.MAX_NAMESPACES:]:
            shutil.rmtree(old.path, ignore_errors=True)

    def _path(self, name: str, signature: str) -> str:
        digest = hashlib.sha256(signature.encode()).hexdigest()[:24]
        return os.path.join(self.dir, f"{name}-{digest}.exe")

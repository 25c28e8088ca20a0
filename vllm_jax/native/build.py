"""Compiles a native kernel's C++ source into a shared library on first use and loads it.

The library is built once per machine into `<cache root>/native/` (`$VLLM_JAX_CACHE_ROOT`, else `~/.cache/vllm_jax`),
under a name that hashes the source and the headers beside it, the compiler and its flags, jaxlib's version (the FFI
headers come from it) and the CPU's model and feature flags: the code is compiled for this CPU (`-march=native`), so
a cache folder shared with another machine never hands it a library it cannot run. Builds write a temporary file and
rename it into place, so concurrent processes (test workers) never load a half-written one. The compilation cache's
switches do not apply (this is a build, not a cache of programs); where the cache root cannot be written, the
library is built under the system's temporary folder.

No compiler, a failed build or `VLLM_JAX_NATIVE_KERNELS=0` leave the kernel unavailable (`library` returns None, with
one warning naming the cause) and the engine uses its XLA path, with the same results up to float32 rounding.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax.ffi
import jaxlib

from vllm_jax.cache_root import default_cache_root

logger = logging.getLogger(__name__)

ENV_SWITCH = "VLLM_JAX_NATIVE_KERNELS"  # "0" / "false" / "off": use the XLA paths only
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
_BUILD_TIMEOUT_S = 300


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


@functools.cache
def library(source_name: str) -> ctypes.CDLL | None:
    """The loaded library built from `vllm_jax/native/<source_name>`, or None when native kernels are off or it
    cannot be built here (warned once)."""
    if not enabled():
        return None
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        logger.warning("native kernel %s: no C++ compiler found (set CXX); using the XLA path", source_name)
        return None
    source = Path(__file__).with_name(source_name)
    try:
        path = _built(source, compiler)
        return ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as e:
        logger.warning("native kernel %s could not be built or loaded (%s); using the XLA path", source_name,
                       str(e).strip()[-2000:])
        return None


@functools.cache
def registered(source_name: str, targets: tuple[tuple[str, str], ...]) -> bool:
    """Whether `library(source_name)` is available, its handlers registered with XLA for the CPU under our names:
    `targets` pairs each target name with the library's symbol. Once per process."""
    lib = library(source_name)
    if lib is None:
        return False
    for target, symbol in targets:
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    return True


def _built(source: Path, compiler: str) -> Path:
    """The library for `source`, compiled now unless a build for this machine is cached."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    headers = [h.read_text() for h in sorted(source.parent.glob("*.h"))]  # what the source includes
    key = "\0".join([source.read_text(), *headers, compiler, version, " ".join(_FLAGS), jaxlib.__version__,
                     _cpu_identity()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    name = f"{source.stem}-{digest}.so"
    folder = Path(default_cache_root()) / "native"
    if (folder / name).exists():
        return folder / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: build where this process may write
        folder = Path(tempfile.gettempdir()) / f"vllm_jax-native-{os.getuid()}"
        folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    if target.exists():
        return target
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *_FLAGS, "-I", jax.ffi.include_dir(), str(source), "-o", tmp],
                              capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise OSError(f"{compiler} exited with {done.returncode}: {done.stderr}")
        os.replace(tmp, target)
        logger.info("native kernel %s built into %s", source.name, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _cpu_identity() -> str:
    """This CPU's model and feature flags (Linux's /proc/cpuinfo), else what `platform` says."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f.read().splitlines()
                     if line.startswith(("model name", "flags", "Features", "CPU part"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"

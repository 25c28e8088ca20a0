"""XLA flags the test session sets before jax starts (tests/conftest.py)."""

import mmap
from pathlib import Path


def with_legacy_cpu_fusion_emitters(xla_flags: str) -> str:
    """XLA:CPU's older fusion emitters compile a tiny model's programs in about half the CPU time of the new MLIR
    ones, with the same HLO semantics (docs/contributing/testing.md, "Compile time"). XLA aborts the process on a
    flag it does not know, and jaxlib 0.11 dropped this one, so it is added only where jaxlib's library registers
    it: the name as a string of its own (NUL on both sides). A bare substring search is not enough: 0.11 still
    lists the name among DebugOptions' reserved fields, and a test session there died silently in conftest.
    Set in the environment, so the subprocesses the tests start compile the same way."""
    flag = "xla_cpu_use_fusion_emitters"
    if flag in xla_flags:
        return xla_flags
    import jaxlib

    library = Path(jaxlib.__file__).parent / "libjax_common.so"
    return f"{xla_flags} --{flag}=false".strip() if registers_flag(library, flag) else xla_flags


def registers_flag(library: Path, flag: str) -> bool:
    """Whether the shared library holds `flag` as a string of its own, as a registered flag's name is stored."""
    try:
        with open(library, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as contents:
            return contents.find(b"\0" + flag.encode() + b"\0") >= 0
    except (OSError, ValueError):
        return False

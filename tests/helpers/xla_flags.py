"""XLA flags the test session sets before jax starts (tests/conftest.py)."""

def with_legacy_cpu_fusion_emitters(xla_flags: str) -> str:
    """XLA:CPU's older fusion emitters compile a tiny model's programs in about half the CPU time of the new MLIR
    ones, with the same HLO semantics (docs/contributing/testing.md, "Compile time"). XLA aborts the process on a
    flag it does not know, and newer jaxlibs may drop this one, so it is added only where jaxlib's library has it.
    Set in the environment, so the subprocesses the tests start compile the same way."""
    flag = "xla_cpu_use_fusion_emitters"
    if flag in xla_flags:
        return xla_flags
    import mmap
    from pathlib import Path

    import jaxlib

    library = Path(jaxlib.__file__).parent / "libjax_common.so"
    try:
        with open(library, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as contents:
            known = contents.find(flag.encode()) >= 0
    except (OSError, ValueError):
        known = False
    return f"{xla_flags} --{flag}=false".strip() if known else xla_flags

"""Test-wide settings: never touch the network, run on CPU in float32."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite's pytest workers already keep every core busy: warm-up compiles one program at a time unless a test
# asks for more (tests/engine/test_engine_e2e.py's engine compiles its forwards two at a time).
os.environ.setdefault("VLLM_JAX_COMPILE_THREADS", "1")

# Compiled programs go to a cache of this test session, never to the user's ~/.cache: engines with the same tiny
# config then load each other's warm-up programs (vllm_jax/worker/compilation_cache.py), which keeps the suite fast.
if "VLLM_JAX_CACHE_ROOT" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["VLLM_JAX_CACHE_ROOT"] = tempfile.mkdtemp(prefix="vllm_jax_test_cache_")
    atexit.register(shutil.rmtree, os.environ["VLLM_JAX_CACHE_ROOT"], ignore_errors=True)

import gc
from pathlib import Path

from tests.helpers.xla_flags import with_legacy_cpu_fusion_emitters

# XLA reads XLA_FLAGS when jax starts its backend: set before that, and inherited by the tests' subprocesses.
os.environ["XLA_FLAGS"] = with_legacy_cpu_fusion_emitters(os.environ.get("XLA_FLAGS", ""))

import jax
import pytest

# Every test process sees 8 fake CPU devices, so the tensor / expert / data parallel checks run in-process
# (tests/helpers/multidevice_checks.py) instead of each paying a fresh Python, a jax import and cold compiles in a
# subprocess. jax's own setting, not XLA_FLAGS: it stays in this process, so the subprocesses the tests start
# (the CLI, the server, the two jax.distributed processes) see the one device they always saw. Engines with
# tensor_parallel_size 1 take the first device (sharding/mesh.py: make_mesh uses devices[:dp * tp]), as do
# arrays placed without a sharding, and the KV budget on CPU is sized from the engine's flags, not device memory.
FAKE_CPU_DEVICES = 8
try:
    jax.config.update("jax_num_cpu_devices", FAKE_CPU_DEVICES)
except RuntimeError:  # a plugin started jax's backend first: fine as long as it has the devices
    if jax.device_count() < FAKE_CPU_DEVICES:
        raise pytest.UsageError(f"the tests need {FAKE_CPU_DEVICES} CPU devices; jax started with "
                                f"{jax.device_count()} before tests/conftest.py could ask for them") from None

# The suite's programs are tiny (2-layer models, vocabularies of a few hundred) and each engine compiles its warm-up
# set once, so compiling is most of the suite's time and running is little. XLA's optimizations off (LLVM at -O0,
# no expensive passes) halve the compile time of a sampler and cut a tiny engine's warm-up by ~40%, at no cost in
# what is checked: the programs compute the same values (fusion and codegen change, the HLO's semantics do not).
# The programs users run are still compiled optimized here: by the subprocesses the tests start (the CLI, the
# server, the compilation-cache restarts; this setting stays in this process), by the default model's tests
# (tests/served/test_default_model.py turns it back on), by .ci/smoke and by the ahead-of-time checks.
jax.config.update("jax_disable_most_optimizations", True)

# XLA:CPU maps every compiled kernel's code and data as separate memory regions (about 170 per program), and
# Linux caps a process at vm.max_map_count regions (65530 by default). An engine is freed only when the garbage
# collector reaches its reference cycles, so hundreds of engines in one test process ran past the cap and XLA
# crashed (SIGSEGV) serializing the next compiled program. Collect the dead engines before that can happen.
_MAPPED_REGIONS_BEFORE_COLLECTING = 16384


def _mapped_regions() -> int:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:  # not Linux: no such cap to stay under
        return 0


# The same dead engines hold their KV caches and weights until then: with three workers on a 24 GiB machine the
# workers grew to 6-8 GiB each and the kernel's OOM killer took one (CI hung on the lost worker). So a worker also
# collects when its resident memory has grown by this much since it last did.
_RESIDENT_GROWTH_BEFORE_COLLECTING = 1 << 30
_resident_after_collecting = 0


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):  # not Linux
        return 0


@pytest.fixture(autouse=True)
def _free_dead_engines():
    global _resident_after_collecting
    yield
    if (_mapped_regions() > _MAPPED_REGIONS_BEFORE_COLLECTING
            or _resident_bytes() > _resident_after_collecting + _RESIDENT_GROWTH_BEFORE_COLLECTING):
        gc.collect()
        _resident_after_collecting = _resident_bytes()


# Each test's tier is the folder its module lives in (registered in pyproject.toml), so `python -m pytest -m unit`
# and `python -m pytest tests/unit` run the same fast tier.
TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "engine", "multidevice", "served")


def tier_of(path: Path) -> str | None:
    """The tier folder of a test module under tests/ (None for a module outside one)."""
    parts = path.resolve().relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


class _OutsideTierFolder(pytest.File):
    """A test module with no tier folder: collecting it fails, so it is never run untiered."""

    def collect(self):
        raise self.CollectError(f"{self.path.relative_to(TESTS.parent)} is outside the tier folders: move it into "
                                f"{', '.join(f'tests/{tier}/' for tier in TIERS)} (docs/contributing/testing.md)")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if (file_path.suffix == ".py" and file_path.name.startswith("test_") and file_path.is_relative_to(TESTS)
            and tier_of(file_path) is None):
        return _OutsideTierFolder.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One tier marker per test (unit / engine / multidevice / served), its module's folder."""
    for item in items:
        if item.path.is_relative_to(TESTS) and (tier := tier_of(item.path)) is not None:
            item.add_marker(getattr(pytest.mark, tier))


def pytest_configure(config: pytest.Config) -> None:
    """`VLLM_JAX_COMPILE_REPORT=DIR`: write where each module's compile time went (tests/helpers/compile_report.py)."""
    out_dir = os.environ.get("VLLM_JAX_COMPILE_REPORT")
    xdist_controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if out_dir and not xdist_controller:  # the workers run the tests; the controller only relays their reports
        from tests.helpers.compile_report import CompileReport

        config.pluginmanager.register(CompileReport(Path(out_dir)), "vllm_jax_compile_report")

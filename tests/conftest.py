"""Test-wide settings: never touch the network, run on CPU in float32."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Compiled programs go to a cache of this test session, never to the user's ~/.cache: engines with the same tiny
# config then load each other's warm-up programs (vllm_jax/worker/compilation_cache.py), which keeps the suite fast.
if "VLLM_JAX_CACHE_ROOT" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["VLLM_JAX_CACHE_ROOT"] = tempfile.mkdtemp(prefix="vllm_jax_test_cache_")
    atexit.register(shutil.rmtree, os.environ["VLLM_JAX_CACHE_ROOT"], ignore_errors=True)

import gc  # noqa: E402

import pytest  # noqa: E402

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


@pytest.fixture(autouse=True)
def _free_dead_engines():
    yield
    if _mapped_regions() > _MAPPED_REGIONS_BEFORE_COLLECTING:
        gc.collect()

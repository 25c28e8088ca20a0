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

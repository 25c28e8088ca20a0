"""The per-user folder vllm_jax keeps what it builds in: compiled programs (`compile/`, worker/compilation_cache.py)
and native kernel libraries (`native/`, native/build.py). A leaf, so that the lowest layers can ask for it."""

from __future__ import annotations

import os


def default_cache_root() -> str:
    """`$VLLM_JAX_CACHE_ROOT`, else `$XDG_CACHE_HOME/vllm_jax`, else `~/.cache/vllm_jax`."""
    root = os.environ.get("VLLM_JAX_CACHE_ROOT")
    if root:
        return os.path.expanduser(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "vllm_jax")

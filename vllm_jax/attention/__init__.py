"""Attention backends: `attention_backend_for(--attention-backend, platform)` gives the one object that owns the
KV cache layout, the block-table width, the KV write and attention calls on its kernels (pallas_kernels/) and
their shard_map wrapping under tensor parallelism (docs/architecture/09-sharding.md, "Sharding"). Only selector.py reads
a backend's name; everything else asks the object."""

from vllm_jax.attention.base import AttentionBackend
from vllm_jax.attention.selector import BACKENDS, attention_backend_for

__all__ = ["AttentionBackend", "BACKENDS", "attention_backend_for"]

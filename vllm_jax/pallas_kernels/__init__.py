"""Ragged paged attention and the KV-cache write behind one dispatch (xla reference; Pallas TPU/GPU kernels)."""

from vllm_jax.pallas_kernels.dispatch import BACKENDS, ragged_paged_attention, resolve_backend, write_kv_cache

__all__ = ["BACKENDS", "ragged_paged_attention", "resolve_backend", "write_kv_cache"]

"""Ragged paged attention and the KV-cache write behind one dispatch: XLA reference (CPU default, test oracle),
Pallas TPU (Mosaic) and Pallas GPU (Triton) kernels."""

from vllm_jax.pallas_kernels.dispatch import BACKENDS, ragged_paged_attention, resolve_backend, write_kv_cache

__all__ = ["BACKENDS", "ragged_paged_attention", "resolve_backend", "write_kv_cache"]

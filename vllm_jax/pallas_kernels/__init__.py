"""Ragged paged attention and the KV-cache write behind one dispatch: plain XLA (the CPU default), Pallas TPU
(Mosaic) and Pallas GPU (Triton) kernels; the tests hold each against a numpy oracle that shares no code with
them (tests/helpers/attention_oracle.py)."""

from vllm_jax.pallas_kernels.dispatch import (BACKENDS, mla_ragged_paged_attention, ragged_paged_attention,
                                              resolve_backend, write_kv_cache)

__all__ = ["BACKENDS", "mla_ragged_paged_attention", "ragged_paged_attention", "resolve_backend", "write_kv_cache"]

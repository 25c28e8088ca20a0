"""One entry point for attention and the KV write; the backend is chosen by name or by platform.

The model calls `ragged_paged_attention` / `write_kv_cache` and never knows which implementation runs.
"""

from __future__ import annotations

import jax

from vllm_jax.pallas_kernels import reference

BACKENDS = ("xla", "pallas_tpu", "pallas_gpu")


def resolve_backend(name: str = "auto", platform: str | None = None) -> str:
    """Map `--attention-backend` to an implementation available on this platform."""
    platform = platform or jax.default_backend()
    if name == "auto":
        # The Pallas kernels (issue #5) take over on TPU/GPU once they land; until then XLA everywhere.
        return "xla"
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of auto, {', '.join(BACKENDS)}; got {name!r}")
    if name != "xla":
        raise NotImplementedError(f"attention backend {name!r} is not available yet; use 'xla' or 'auto'")
    return name


def ragged_paged_attention(q: jax.Array, kv_cache_layer: jax.Array, block_tables: jax.Array, seq_lens: jax.Array,
                           query_start_loc: jax.Array, num_seqs: jax.Array, *, sm_scale: float,
                           sliding_window: int | jax.Array | None = None, soft_cap: float | None = None,
                           backend: str = "auto", interpret: bool = False,
                           layer_index: jax.Array | int | None = None) -> jax.Array:
    """Causal ragged attention over a paged KV cache -> [T, num_q_heads, head_dim].

    Extension to DESIGN.md's signature: with `layer_index`, `kv_cache_layer` may be the whole
    [num_layers, ...] stack, so a layer-scanned model never slices (copies) a layer out of the donated cache.
    """
    del interpret  # only the Pallas backends use it
    resolve_backend(backend)
    return reference.ragged_paged_attention_xla(
        q, kv_cache_layer, block_tables, seq_lens, query_start_loc, num_seqs, sm_scale=sm_scale,
        sliding_window=sliding_window, soft_cap=soft_cap, layer_index=layer_index)


def write_kv_cache(kv_cache: jax.Array, k: jax.Array, v: jax.Array, slot_mapping: jax.Array, *,
                   layer_index: jax.Array | int | None = None, backend: str = "auto") -> jax.Array:
    """Write this step's K/V at `slot_mapping` (K/V interleaved on the head axis); the cache is updated in place
    when donated."""
    resolve_backend(backend)
    return reference.write_kv_cache(kv_cache, k, v, slot_mapping, layer_index=layer_index)

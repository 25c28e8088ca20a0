"""One gated DeltaNet layer's HF tensors as `gated_deltanet`'s weights: linears transposed to [in, out], the
depthwise conv's [C, 1, K] squeezed to [C, K], and Qwen3-Next's two fused input projections split into Qwen3.5's
four. Qwen3-Next's in_proj_qkvz / in_proj_ba interleave their parts per key head (for each key head: its q, its k,
the v and z of the value heads it serves; then its value heads' b and a), so each of our projections is a set of
rows of the fused tensor (`qwen3_next_rows`); a family's weight map can read those rows lazily, and
`hf_gated_deltanet_weights` takes them from whole tensors."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from vllm_jax.model.ssm.gated_deltanet import GatedDeltaNetSpec

LINEARS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
VECTORS = {"dt_bias": "dt_bias", "A_log": "A_log", "norm": "norm.weight"}  # ours -> HF name in the layer


def qwen3_next_rows(spec: GatedDeltaNetSpec) -> dict[str, tuple[str, np.ndarray]]:
    """Each of Qwen3.5's input projections as (the Qwen3-Next tensor holding it, its rows there, in our order)."""
    groups, per_group = spec.num_k_heads, spec.num_v_heads // spec.num_k_heads
    dk, vz = spec.head_k_dim, per_group * spec.head_v_dim  # a group's q (or k) rows, and its v (or z) rows
    unit = 2 * dk + 2 * vz  # one key head's rows of in_proj_qkvz

    def rows(offset: int, width: int, stride: int) -> np.ndarray:
        return (np.arange(groups)[:, None] * stride + offset + np.arange(width)[None, :]).reshape(-1)

    q, k = rows(0, dk, unit), rows(dk, dk, unit)
    v, z = rows(2 * dk, vz, unit), rows(2 * dk + vz, vz, unit)
    return {"in_proj_qkv": ("in_proj_qkvz", np.concatenate([q, k, v])),
            "in_proj_z": ("in_proj_qkvz", z),
            "in_proj_b": ("in_proj_ba", rows(0, per_group, 2 * per_group)),
            "in_proj_a": ("in_proj_ba", rows(per_group, per_group, 2 * per_group))}


def hf_gated_deltanet_weights(spec: GatedDeltaNetSpec, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One layer's weights for `gated_deltanet` from its HF tensors, named inside the layer's `linear_attn`
    module ('in_proj_qkv.weight', 'conv1d.weight', 'A_log', ...; Qwen3-Next's 'in_proj_qkvz.weight' and
    'in_proj_ba.weight' in place of the four input projections)."""
    hf = {name: np.asarray(t) for name, t in tensors.items()}
    if "in_proj_qkvz.weight" in hf:
        for ours, (fused, rows) in qwen3_next_rows(spec).items():
            hf[f"{ours}.weight"] = hf[f"{fused}.weight"][rows]
    w = {name: hf[f"{name}.weight"].T for name in LINEARS}
    conv = hf["conv1d.weight"]
    w["conv1d"] = conv.reshape(conv.shape[0], conv.shape[-1])
    w.update({ours: hf[name] for ours, name in VECTORS.items()})
    return w

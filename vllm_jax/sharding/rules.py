"""Partition rules: param path (regex) -> PartitionSpec over the "model" axis, and the KV cache's spec.

Megatron-style tensor parallelism expressed as shardings: q/k/v and gate/up are column-parallel (output dim
split), o_proj and down row-parallel (input dim split), embedding and LM head vocab-parallel; GSPMD inserts the
all-reduces. The KV cache is split on its (interleaved K/V) head axis like k/v. When tp does not divide the
number of KV heads, k/v projections and the KV cache are replicated instead: every device computes and stores
all KV heads (correct, memory-costlier). A dim that tp does not divide stays replicated rather than erroring.
Stacked layer params keep their leading [num_layers] (and [num_experts]) axes; rules name the trailing dims.
A quantized weight's scales (`{name}_scale`, one per output channel: model/quantization.py) are split like its
output dim: with a column-parallel weight, replicated with a row-parallel one. Grouped scales ([L, in // g, out],
a block-fp8 checkpoint's; a kept GGUF's, whose Q4_1 also has `{name}_min` of the same shape: model/grouped_quant.py)
are split like the whole weight: on out when column-parallel, on the input groups when row-parallel, as the values
split on their (packed) input rows, so each device holds whole groups whenever tp divides the group count. When
tp divides the rows but not the groups (576 rows = 18 groups at tp 4), the scales stay replicated (`_spec_at`)
while the values split: GSPMD still computes the same product, at the cost of resharding. A kept embedding's
[V, H // 32] scales split on vocab like it.
"""

from __future__ import annotations

import re
from typing import Any

from jax.sharding import PartitionSpec as P

from vllm_jax.sharding.mesh import MODEL_AXIS

# (regex on "a/b" param path, index of the dim to shard counted from the END, or None = replicate)
_COLUMN, _ROW = -1, -2
PARAM_RULES: list[tuple[str, int | None]] = [
    (r"^embed_tokens(_scale|_min)?$", -2),  # [V, H] (kept: [V, H // 32] scales): vocab-parallel
    (r"^lm_head(_scale|_min)?$", _COLUMN),  # [H, V] (kept: [H // 32, V] scales): vocab-parallel
    (r"^layers/(q_proj|gate_proj|up_proj)$", _COLUMN),
    # fused q/k/v (model/fused_projections.py): columns in units of one KV head, so a split of the output dim
    # holds whole units (the model fuses only when tp divides the KV heads)
    (r"^layers/qkv_proj$", _COLUMN),
    # MLA (model/mla.py): q_b / kv_b outputs are head-major, split by heads; the latent projections (q_a_proj,
    # kv_a_proj) and the latent cache are replicated; DeepSeek's shared experts split like a dense MLP
    (r"^layers/(q_b_proj|kv_b_proj|shared_gate|shared_up)$", _COLUMN),
    (r"^layers/shared_down$", _ROW),
    (r"^layers/(k_proj|v_proj)$", _COLUMN),  # replicated when tp does not divide num_kv_heads (below)
    (r"^layers/(q_bias|gate_bias|up_bias)$", -1),
    (r"^layers/(k_bias|v_bias)$", -1),
    (r"^layers/(o_proj|down_proj)$", _ROW),
    (r"^layers/experts_(gate|up)$", _COLUMN),  # MoE [L, E, H, I] without EP: split I
    (r"^layers/experts_down$", _ROW),  # [L, E, I, H]
    (r"^layers/experts_gate_up(_bias)?$", -1),  # gpt-oss [L, E, H, 2I] / [L, E, 2I]: interleaved pairs stay whole
    (r"^layers/sinks$", -1),  # gpt-oss [L, num_heads]: split with the query heads
    (r"^layers/(q_proj|gate_proj|up_proj|k_proj|v_proj|experts_gate|experts_up)_(scale|min)$", -1),  # [.., out]
    (r"^layers/(o_proj|down_proj)_min$", _ROW),  # kept GGUF blocks: [L, in // 32, out], split the groups
    # Gemma 4 (model/gemma4.py): layers stacked per group, `layers/{sliding|full}[_shared]_{name}`; its K/V
    # projections stay replicated (per-layer KV head counts, tp rarely divides E4B's 2); the per-layer-input
    # embedding table [V, L * ple] is vocab-parallel like embed_tokens
    (r"^layers/(sliding|full)(_shared)?_(q_proj|gate_proj|up_proj|per_layer_input_gate)$", _COLUMN),
    (r"^layers/(sliding|full)(_shared)?_(o_proj|down_proj|per_layer_projection)$", _ROW),
    (r"^embed_tokens_per_layer$", -2),
    # its MoE block (model/gemma4_moe.py) without EP: experts split on I like Mixtral's; router and scales replicated
    (r"^layers/(sliding|full)(_shared)?_experts_(gate|up)$", _COLUMN),
    (r"^layers/(sliding|full)(_shared)?_experts_down$", _ROW),
    (r".*", None),  # norms, o/down biases, router, q/k norms, row-parallel scales: replicated
]
_ROW_SCALES = re.compile(r"^layers/(o_proj|down_proj)_scale$")
_KV_PARAMS = re.compile(r"^layers/(k_proj|v_proj|k_bias|v_bias|k_proj_scale|v_proj_scale|k_proj_min|v_proj_min)$")
_EXPERT_PARAMS = re.compile(r"^layers/((sliding|full)(_shared)?_)?experts_")  # Gemma 4's carry their group


def kv_head_layout(num_kv_heads: int, tp: int, num_q_heads: int | None = None) -> str:
    """How the Pallas kernels split attention over tp devices (attention/tensor_parallel.py): "sharded" (tp
    divides the KV heads: each device its own heads) or "replicated" (tp is a multiple of them: every device all
    KV heads, its own query heads); else a ValueError."""
    if num_q_heads is not None and num_q_heads % tp:
        raise ValueError(f"--tensor-parallel-size ({tp}) must divide the number of query heads ({num_q_heads})")
    if num_kv_heads % tp == 0:
        return "sharded"
    if tp % num_kv_heads == 0:
        return "replicated"
    raise ValueError(f"--tensor-parallel-size ({tp}) must divide the number of KV heads ({num_kv_heads}) or be a "
                     f"multiple of it for the Pallas kernels; use a tp that does, or --attention-backend xla")


def check_tensor_parallel_layout(spec: Any, tp: int, attention_backend: Any = None) -> None:
    """Start-up check: tp must split the query heads evenly; with a backend whose kernels run in shard_map (the
    resolved vllm_jax.attention backend: `shard_mapped`, `name`) it must also divide the KV heads or be a
    multiple of them (kv_head_layout), so a layout they cannot serve is refused here, not at the first request.
    The xla backend (or none) takes any KV head count (GSPMD replicates what tp does not divide)."""
    if spec.num_heads % tp:
        raise ValueError(f"tensor_parallel_size ({tp}) must divide the model's num_attention_heads "
                         f"({spec.num_heads})")
    if tp > 1 and attention_backend is not None and attention_backend.shard_mapped:
        try:
            kv_head_layout(spec.num_kv_heads, tp, spec.num_heads)
        except ValueError as exc:
            raise ValueError(f"attention backend {attention_backend.name}: {exc}") from None


def kv_heads_sharded(spec: Any, tp: int) -> bool:
    return spec.num_kv_heads % tp == 0


def param_partition_spec(path: tuple[str, ...], shape: tuple[int, ...], spec: Any, tp: int,
                         expert_parallel: bool = False) -> P:
    if tp == 1:
        return P()
    name = "/".join(path)
    if expert_parallel and _EXPERT_PARAMS.match(name):
        return _spec_at(len(shape), 1, shape, tp)  # [L, E, ...]: split the experts
    if _KV_PARAMS.match(name) and not kv_heads_sharded(spec, tp):
        return P()
    if _ROW_SCALES.match(name) and len(shape) == 3:  # grouped [L, in // g, out]: the groups follow the input dim
        return _spec_at(3, 1, shape, tp)
    for pattern, dim in PARAM_RULES:
        if re.match(pattern, name):
            return P() if dim is None else _spec_at(len(shape), len(shape) + dim, shape, tp)
    return P()


def eagle3_param_partition_spec(path: tuple[str, ...], shape: tuple[int, ...], layer_spec: Any, tp: int) -> P:
    """An EAGLE-3 head's params (spec_decode/device/eagle3_head.py) split like the target's: its midlayer is one Llama
    layer without the layer axis (`layer_spec`: its heads), so the target's rules apply to it by name; `fc` [3 * target
    hidden, H] is row-parallel (its input, the target's replicated states, is split where it is read: each device holds
    a third of a wide matrix, one all-reduce); lm_head on the draft vocabulary and its own embed_tokens on the
    vocabulary, like the target's; the norms and `d2t` replicated."""
    if tp == 1:
        return P()
    if path == ("fc",):
        return _spec_at(2, 0, shape, tp)
    if path[0] == "midlayer":
        path = ("layers", *path[1:])
    return param_partition_spec(path, shape, layer_spec, tp)


def kv_cache_partition_spec(spec: Any, tp: int, lane_dense: bool = False) -> P:
    """[layers, blocks, block_size, 2 * kv_heads, head_dim]: split the interleaved head axis (k_i, v_i stay
    together since each shard holds whole pairs). `lane_dense` (pallas_tpu's [layers, blocks, block_size,
    kv_heads * P], pallas_kernels/kv_layout.py): split the row, whose shards hold whole pair windows."""
    if tp == 1 or not kv_heads_sharded(spec, tp):
        return P()
    return P(None, None, None, MODEL_AXIS) if lane_dense else P(None, None, None, MODEL_AXIS, None)


def _spec_at(ndim: int, axis: int, shape: tuple[int, ...], tp: int) -> P:
    if shape[axis] % tp:
        return P()
    parts: list[str | None] = [None] * ndim
    parts[axis] = MODEL_AXIS
    return P(*parts)

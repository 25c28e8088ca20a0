"""The kernel tests' oracle for ragged paged attention and the KV-cache write: plain Python loops over sequences,
query rows, heads and key positions, in float64 numpy. It shares no code with the backends it checks (nothing
from vllm_jax is imported), so a bug in their masking or layout helpers cannot hide in the oracle too.

The contract it spells out (docs/architecture/04-kv-cache.md, "KV cache layout"):
* sequence s owns query rows query_start_loc[s] .. query_start_loc[s+1] - 1, the last of its seq_lens[s]
  positions; rows from query_start_loc[num_seqs] on are padding and have no expected value;
* a row at position p attends the keys of its own sequence at positions 0..p, or p-w+1..p with a sliding
  window w > 0;
* query head h reads KV head h // (num_q_heads // num_kv_heads) (GQA);
* position i of sequence s lives in page block_tables[s, i // block_size] at offset i % block_size, and K / V
  of KV head j sit at head slots 2j / 2j+1 (k0, v0, k1, v1, ...);
* a score is sm_scale * (q . k), soft-capped to c * tanh(score / c) when a cap c > 0 is given;
* with `sinks` ([num_q_heads], gpt-oss), head h's softmax denominator gains exp(sinks[h]) (a logit with no value:
  neither scaled nor capped), on the same max-shifted scale as the scores.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def attention(q: Any, kv_cache: Any, block_tables: Any, seq_lens: Any, query_start_loc: Any, num_seqs: Any, *,
              sm_scale: float, sliding_window: Any = None, soft_cap: float | None = None,
              layer_index: Any = None, sinks: Any = None) -> np.ndarray:
    """[real rows, num_q_heads, head_dim] float64: the expected output of every row that is not padding."""
    q = np.asarray(q, np.float64)
    cache = np.asarray(kv_cache, np.float64)
    if layer_index is not None:
        cache = cache[int(layer_index)]
    tables, lens, starts = np.asarray(block_tables), np.asarray(seq_lens), np.asarray(query_start_loc)
    live = int(np.asarray(num_seqs).reshape(-1)[0])
    window = 0 if sliding_window is None else int(sliding_window)
    group = q.shape[1] // (cache.shape[2] // 2)
    out = np.zeros((int(starts[live]),) + q.shape[1:])
    for seq in range(live):
        first, end = int(starts[seq]), int(starts[seq + 1])
        for row in range(first, end):
            position = int(lens[seq]) - (end - row)
            keys = _visible_keys(position, window)
            for head in range(q.shape[1]):
                kv_head = head // group
                scores, values = [], []
                for key in keys:
                    page, offset = int(tables[seq, key // cache.shape[1]]), key % cache.shape[1]
                    score = sm_scale * float(np.dot(q[row, head], cache[page, offset, 2 * kv_head]))
                    scores.append(_capped(score, soft_cap))
                    values.append(cache[page, offset, 2 * kv_head + 1])
                sink = None if sinks is None else float(np.asarray(sinks, np.float64)[head])
                out[row, head] = _softmax_average(scores, values, sink)
    return out


def write_kv(kv_cache: Any, k: Any, v: Any, slot_mapping: Any, layer_index: Any = None) -> np.ndarray:
    """The cache after the write, in its own dtype: token t's K / V of KV head j land at page slot // block_size,
    offset slot % block_size, head slots 2j / 2j+1 (of layer `layer_index` when the cache is a layer stack)."""
    cache = np.array(kv_cache)  # a copy
    layer = cache if layer_index is None else cache[int(layer_index)]  # a view into the copy
    k, v = np.asarray(k, np.float32), np.asarray(v, np.float32)
    block_size = layer.shape[1]
    for token, slot in enumerate(np.asarray(slot_mapping)):
        page, offset = divmod(int(slot), block_size)
        for kv_head in range(k.shape[1]):
            layer[page, offset, 2 * kv_head] = k[token, kv_head]
            layer[page, offset, 2 * kv_head + 1] = v[token, kv_head]
    return cache


def _visible_keys(position: int, window: int) -> range:
    return range(max(0, position - window + 1) if window > 0 else 0, position + 1)


def _capped(score: float, soft_cap: float | None) -> float:
    if soft_cap is None or soft_cap <= 0:
        return score
    return soft_cap * math.tanh(score / soft_cap)


def _softmax_average(scores: list[float], values: list[np.ndarray], sink: float | None = None) -> np.ndarray:
    top = max(scores) if sink is None else max(max(scores), sink)
    weights = [math.exp(s - top) for s in scores]
    extra = 0.0 if sink is None else math.exp(sink - top)
    return sum(w * v for w, v in zip(weights, values)) / (sum(weights) + extra)

"""Gemma 4 through the Pallas kernels (interpret mode on CPU): the kernels at Gemma 4's cache shapes against the
numpy oracle, and a tiny Gemma 4 engine giving the xla backend's greedy tokens and logprobs.

Gemma 4's layers write K/V repeated to the cache's KV heads and zero-padded to the widest head_dim, and attend
with q zero-padded alike, an explicit sm_scale of 1.0 and per-layer sliding windows (docs/architecture/12-families.md,
"Gemma 4"). The tiny checkpoint (tests/helpers/gemma4_models.py) has sliding layers of head_dim 16 with 2 KV heads
and k_eq_v full layers of 32 with one KV head (repeated to 2), two of its five layers KV-shared: so padded q,
repeated heads, windowed and full layers and cache layers read by two layers all go through each kernel. pallas_tpu
keeps the lane-dense cache (one 128-lane pair window per KV head: kv_layout.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import attention_oracle as oracle
from tests.helpers.family_checks import engine_prompts
from tests.helpers.gemma4_models import make_tiny_gemma4
from tests.helpers.ragged_batches import make_batch
from vllm_jax import LLM, SamplingParams
from vllm_jax.attention import attention_backend_for
from vllm_jax.pallas_kernels import tpu_attention
from vllm_jax.pallas_kernels.kv_layout import row_lanes

# (id, narrow layer head_dim, cache width, sliding window): the tiny checkpoint's widths (pair-window path on
# pallas_tpu) and E4B's (512: K and V are the halves of a 1024-lane pair window)
WIDTHS = [("d16_in_32_window5", 16, 32, 5), ("d256_in_512_full", 256, 512, None)]
CACHE_HEADS, Q_HEADS, SM_SCALE = 2, 4, 0.7  # a narrow layer's 1 KV head repeated to the cache's 2


def _empty_cache(backend: str, layers: int, blocks: int, block_size: int, width: int) -> jax.Array:
    if backend == "pallas_tpu":  # lane-dense rows (kv_layout.py)
        return jnp.zeros((layers, blocks, block_size, row_lanes(CACHE_HEADS, width)), jnp.float32)
    return jnp.zeros((layers, blocks, block_size, 2 * CACHE_HEADS, width), jnp.float32)


@pytest.mark.parametrize("case", WIDTHS, ids=[c[0] for c in WIDTHS])
@pytest.mark.parametrize("backend", ["xla", "pallas_tpu", "pallas_gpu"])
def test_narrow_layer_padded_and_repeated_into_a_wide_cache_attends_as_its_own_shape(backend, case):
    """A layer of one KV head of width d writes its K/V repeated to the cache's 2 KV heads and zero-padded to
    the cache width (layer 1 of a 2-layer stack, through the backend's own write), then attends with q
    zero-padded alike, an explicit sm_scale and its window: the output's first d lanes are the oracle's
    attention over the unpadded, unrepeated K/V (GQA group 4), and the padding lanes are zero."""
    _, d, width, window = case
    q, narrow, tables, lens, qsl, num_seqs, total = make_batch("mixed", group=Q_HEADS, head_dim=d,
                                                               dtype=jnp.float32, block_size=8, layers=2,
                                                               seed=d, num_kv_heads=1)
    want = oracle.attention(q, narrow, tables, lens, qsl, num_seqs, sm_scale=SM_SCALE, sliding_window=window,
                            layer_index=1)
    _, blocks, block_size, _, _ = narrow.shape
    rows = np.asarray(narrow[1]).reshape(blocks * block_size, 2, d)  # every slot's (K, V) of the narrow layer
    k, v = (np.pad(np.repeat(rows[:, i:i + 1], CACHE_HEADS, axis=1), ((0, 0), (0, 0), (0, width - d)))
            for i in (0, 1))
    interpret = tpu_attention.interpret_params() if backend == "pallas_tpu" else True
    kernels = attention_backend_for(backend, interpret=interpret)
    cache = kernels.write_kv_cache(_empty_cache(backend, 2, blocks, block_size, width), jnp.asarray(k),
                                   jnp.asarray(v), jnp.arange(blocks * block_size, dtype=jnp.int32),
                                   layer_index=jnp.int32(1))
    q_wide = jnp.pad(q, ((0, 0), (0, 0), (0, width - d)))
    got = np.asarray(jax.jit(lambda q, c: kernels.attention(
        q, c, tables, lens, qsl, num_seqs, sm_scale=SM_SCALE,
        sliding_window=None if window is None else jnp.int32(window), layer_index=jnp.int32(1)))(q_wide, cache))
    assert got.shape == q_wide.shape and np.isfinite(got).all()
    np.testing.assert_allclose(got[:total, :, :d], want, atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(got[:total, :, d:], 0.0)


ENGINE_ARGS = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=24, max_num_seqs=4,
                   max_num_batched_tokens=32, enable_prefix_caching=False, min_token_bucket=32, min_seq_bucket=4)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4_pallas")
    make_tiny_gemma4(path, seed=3)
    return str(path)


@pytest.fixture(scope="module")
def prompts():
    return engine_prompts()[:4]


def _generate(checkpoint: str, prompts: list[list[int]], backend: str):
    llm = LLM(checkpoint, attention_backend=backend, **ENGINE_ARGS)
    return llm, llm.generate(prompts, GREEDY, use_tqdm=False)


@pytest.fixture(scope="module")
def xla_outputs(checkpoint, prompts):
    return _generate(checkpoint, prompts, "xla")[1]


@pytest.mark.parametrize("backend, cache_row", [("pallas_tpu", (8, 256)), ("pallas_gpu", (8, 4, 32))])
def test_greedy_tokens_and_logprobs_through_pallas_kernel_equal_xla_backend(checkpoint, prompts, xla_outputs,
                                                                           backend, cache_row):
    """The same greedy tokens, and the same top logprobs (float32, within 1e-4), as the xla backend; pallas_tpu's
    cache is lane-dense: 2 KV heads x a 128-lane pair window of width 32."""
    llm, outputs = _generate(checkpoint, prompts, backend)
    assert llm.llm_engine.runner.kv_cache.shape[2:] == cache_row
    for ours, ref in zip(outputs, xla_outputs):
        assert list(ours.outputs[0].token_ids) == list(ref.outputs[0].token_ids)
        for mine, theirs in zip(ours.outputs[0].logprobs, ref.outputs[0].logprobs):
            assert mine.keys() == theirs.keys()
            np.testing.assert_allclose([mine[t].logprob for t in mine], [theirs[t].logprob for t in mine],
                                       atol=1e-4)

"""model/row_gather.py: the chunked gather returns exactly table[indices], and only a TPU program of an unsharded
forward takes it (a loop over 32-row chunks instead of one unrolled gather), for the embedding lookup and the
logits rows of a real model's forward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.lowering import lowered_forward_text
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax.model.row_gather import CHUNK_ROWS, rows_by_chunks, take_rows


@pytest.mark.parametrize("n", [CHUNK_ROWS * 2, CHUNK_ROWS * 8])
def test_rows_by_chunks_equal_the_gather(n):
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.standard_normal((300, 24)), jnp.float32)
    indices = jnp.asarray(rng.integers(0, 300, n), jnp.int32)
    indices = indices.at[:3].set(jnp.asarray([299, 0, 299], jnp.int32))  # the ends, and a row twice
    got = jax.jit(rows_by_chunks)(table, indices)
    assert got.shape == (n, 24)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(table)[np.asarray(indices)])
    np.testing.assert_array_equal(np.asarray(jax.jit(take_rows)(table, indices)), np.asarray(got))


def _loops(platform: str, n: int, **kwargs) -> int:
    """How many while loops `take_rows` of n indices has in a program exported for `platform`."""
    table = jnp.zeros((512, 128), jnp.bfloat16)
    exported = jax.export.export(jax.jit(lambda t, i: take_rows(t, i, **kwargs)), platforms=[platform])(
        table, jnp.zeros((n,), jnp.int32))
    return exported.mlir_module().count("stablehlo.while")


def test_only_an_unsharded_tpu_program_loops_over_chunks():
    assert _loops("tpu", 256) == 1
    assert _loops("cpu", 256) == 0
    assert _loops("cuda", 256) == 0
    assert _loops("tpu", 256, sharded=True) == 0  # a vocab-parallel table's gather would all-reduce per chunk
    assert _loops("tpu", CHUNK_ROWS) == 0  # one chunk: the gather itself
    assert _loops("tpu", CHUNK_ROWS * 3 + 1) == 0  # not whole chunks (buckets are powers of two)


@pytest.fixture(scope="module")
def tpu_runner(tmp_path_factory):
    """A tiny Llama's runner built for a TPU on this CPU host (random weights: only its programs are looked at)."""
    from vllm_jax import EngineArgs
    from vllm_jax.worker.model_runner import ModelRunner

    path = tmp_path_factory.mktemp("tiny_llama")
    make_tiny_checkpoint("llama", path, seed=0)
    args = EngineArgs(model=str(path), compilation_cache=False, max_model_len=64, block_size=8,
                      num_gpu_blocks_override=32, max_num_seqs=8, max_num_batched_tokens=32)
    return ModelRunner(args.create_config(platform="tpu"), random_weights=True)


def _forward_loops(runner, num_tokens: int, num_seqs: int) -> int:
    """The while loops in the runner's forward for a (tokens, sequences) bucket, lowered for a TPU."""
    return lowered_forward_text(runner, num_tokens, num_seqs, "tpu").count("stablehlo.while")


def test_a_tpu_forward_gathers_its_embeddings_and_logits_rows_in_chunks(tpu_runner):
    base = _forward_loops(tpu_runner, 16, 8)  # 16 ids, 8 logits rows: each one gather
    assert _forward_loops(tpu_runner, 64, 8) == base + 1  # the embedding lookup of 64 ids
    assert _forward_loops(tpu_runner, 64, 64) == base + 2  # and the 64 logits rows

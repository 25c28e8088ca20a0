"""float32 means float32 on every chip (pallas_kernels/precision.py): a float32 model's forward and the xla
attention backend trace their dots at "highest" precision, where jax's default is TF32 on NVIDIA GPUs and one
bfloat16 pass on TPUs (found on an H200: docs/accelerators.md, "On an NVIDIA H200"); bfloat16 keeps the default."""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import pytest

from tests.helpers.ragged_batches import make_batch
from tests.helpers.tiny_models import make_tiny_checkpoint
from vllm_jax import EngineArgs
from vllm_jax.attention import attention_backend_for
from vllm_jax.model.decoder import forward
from vllm_jax.pallas_kernels import xla_attention
from vllm_jax.pallas_kernels.precision import compute_dtype, float32_matmuls
from vllm_jax.worker.batch import pack_step_inputs
from vllm_jax.worker.model_runner import ModelRunner


def _dot_precisions(jaxpr) -> set:
    """The precision of every dot_general in a jaxpr, nested jaxprs (scan, cond, while, pjit) included."""
    found = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.add(eqn.params["precision"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found |= _dot_precisions(sub)
    return found


HIGHEST = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)


def test_the_context_sets_highest_for_float32_only():
    for dtype, expected in ((jnp.float32, {HIGHEST}), (jnp.bfloat16, {None})):
        def matmul(a, b, dtype=dtype):
            with float32_matmuls(dtype):
                return a @ b
        x = jnp.ones((4, 4), dtype)
        assert _dot_precisions(jax.make_jaxpr(matmul)(x, x).jaxpr) == expected


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_xla_attention_backend_multiplies_float32_at_highest_precision(dtype):
    *batch, _ = make_batch("mixed", group=2, head_dim=32, dtype=dtype, block_size=8, layers=None, seed=3)
    backend = attention_backend_for("xla")
    expected = {HIGHEST} if dtype == jnp.float32 else {None}
    jaxpr = jax.make_jaxpr(lambda *a: backend.attention(*a, sm_scale=0.2))(*batch).jaxpr
    assert _dot_precisions(jaxpr) == expected
    # the function itself, called outside any backend or model program (as the kernel tests and benchmarks do)
    jaxpr = jax.make_jaxpr(lambda *a: xla_attention.ragged_paged_attention(*a, sm_scale=0.2))(*batch).jaxpr
    assert _dot_precisions(jaxpr) == expected


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_models_forward_takes_its_precision_from_its_dtype(tmp_path, dtype):
    make_tiny_checkpoint("llama", tmp_path)
    config = EngineArgs(model=str(tmp_path), dtype=dtype, max_model_len=64, max_num_seqs=2,
                        max_num_batched_tokens=16).create_config()
    runner = ModelRunner(config, random_weights=True)
    assert compute_dtype(runner.params) == jnp.dtype(dtype)
    inputs = pack_step_inputs([], block_size=runner.block_size, max_blocks_per_seq=runner.max_blocks_per_seq,
                              num_tokens_padded=runner.token_buckets[0],
                              num_seqs_padded=runner.seq_bucket(runner.token_buckets[0]))
    graphdef = runner.device.graphdef
    jaxpr = jax.make_jaxpr(lambda p, c, i: forward(graphdef, p, c, i))(runner.params, runner.kv_cache, inputs).jaxpr
    assert _dot_precisions(jaxpr) == ({HIGHEST} if dtype == "float32" else {None})

"""The Pallas kernels under tensor parallelism (attention/tensor_parallel.py): attention and the KV write inside
shard_map on 8 fake CPU devices, in interpret mode, TP 2 and 4 against TP 1 (in-process: the session has 8 fake CPU
devices, tests/conftest.py). Cases: 4 KV heads (the cache split at tp 2 and 4) and 2 KV heads with a sliding window
and attention sinks (split at tp 2, replicated at tp 4, where each device's query heads read one KV head of the
replicated pages); DeepSeek's MLA kernels with their heads split over the replicated latent cache. Then the
engine: greedy generation through the TPU kernel at TP 4 and the GPU kernel at TP 2 gives the tokens of TP 1."""

from __future__ import annotations

import json

import pytest

from tests.helpers import kernel_sharding_checks
from tests.helpers.multidevice_checks import run_check
from vllm_jax.sharding.rules import kv_head_layout


@pytest.fixture(scope="module")
def checks() -> dict:
    return json.loads(json.dumps(kernel_sharding_checks.main()))


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> dict:
    return run_check("pallas_tensor_parallel", tmp_path_factory.mktemp("tp"))


@pytest.mark.parametrize("backend", ["pallas_tpu", "pallas_gpu"])
@pytest.mark.parametrize("case", ["kv4_g2", "kv2_g4_window_sinks"])
def test_tp2_and_tp4_attention_equals_tp1(checks, backend, case):
    assert checks[f"{backend}/{case}/tp1_vs_oracle"] < (2e-5 if case == "kv4_g2" else 3e-2)
    for tp in (2, 4):
        got = checks[f"{backend}/{case}/tp{tp}"]
        assert got["max_diff"] <= 1e-6, (tp, got)
    assert checks[f"{backend}/kv2_g4_window_sinks/tp4"]["layout"] == "replicated"
    assert checks[f"{backend}/kv4_g2/tp4"]["layout"] == "sharded"


@pytest.mark.parametrize("backend", ["pallas_tpu", "pallas_gpu"])
def test_tp2_and_tp4_kv_write_equals_tp1_and_keeps_the_cache_sharding(checks, backend):
    for heads in (4, 2):
        assert checks[f"{backend}/kv_write_kv{heads}/tp1_equals_oracle"]
        for tp in (2, 4):
            got = checks[f"{backend}/kv_write_kv{heads}/tp{tp}"]
            assert got["equal"], (heads, tp)
            replicated = heads == 2 and tp == 4
            sharded = ["None", "None", "None", "model"] + ([] if backend == "pallas_tpu" else ["None"])  # lane-dense
            assert got["spec"] == ([] if replicated else sharded)


@pytest.mark.parametrize("backend", ["pallas_tpu", "pallas_gpu"])
def test_mla_kernels_split_over_the_heads_at_tp2_and_tp4_equal_tp1(checks, backend):
    """DeepSeek MLA inside shard_map: 8 heads split 2 and 4 ways over the replicated latent cache."""
    assert checks[f"{backend}/mla/tp1_vs_xla"] < 2e-5
    assert checks[f"{backend}/mla/tp2"] <= 1e-6 and checks[f"{backend}/mla/tp4"] <= 1e-6


def test_layouts_the_kernels_cannot_split_are_clear_errors():
    assert kv_head_layout(8, 2, 32) == "sharded" and kv_head_layout(8, 16, 32) == "replicated"
    with pytest.raises(ValueError, match="--tensor-parallel-size"):
        kv_head_layout(6, 4, 24)
    with pytest.raises(ValueError, match="query heads"):
        kv_head_layout(2, 4, 6)


@pytest.mark.parametrize("backend, tp", [("pallas_tpu", 4), ("pallas_gpu", 2)])
def test_engine_greedy_tokens_through_each_kernel_under_tp_equal_tp1(engine, backend, tp):
    """The tiny Llama's 2 KV heads are split at tp 2 and replicated at tp 4."""
    assert all(len(tokens) == 10 for tokens in engine[f"{backend}_tp1"])
    assert engine[f"{backend}_tp{tp}"] == engine[f"{backend}_tp1"]


@pytest.mark.parametrize("backend, tp", [("pallas_tpu", 4), ("pallas_gpu", 2)])
def test_under_tp_the_model_calls_the_kernel_inside_shard_map(engine, backend, tp):
    assert engine[f"{backend}_tp1_traced"] == {"pallas_call": True, "shard_map": False}
    assert engine[f"{backend}_tp{tp}_traced"] == {"pallas_call": True, "shard_map": True}
    assert engine["qwen3_moe_tp2_traced"] == {"pallas_call": True, "shard_map": True}


def test_a_kv_layout_the_kernels_cannot_split_is_refused_at_start_up_naming_the_flags(engine):
    message = engine["kv6_tp4_pallas_gpu"]
    assert "--tensor-parallel-size (4)" in message and "KV heads (6)" in message
    assert "--attention-backend xla" in message
    assert engine["kv6_tp4_xla"] == "ok"  # the xla backend replicates the KV heads instead

"""Tensor, expert and data parallelism on the session's 8 fake CPU devices (tests/conftest.py), in-process; the
two-process test keeps its subprocesses: jax.distributed across processes is what it tests."""

from __future__ import annotations

import pytest

from tests.helpers.multidevice_checks import run_check
from tests.helpers.processes import last_json, run_two_jax_processes
from vllm_jax.sharding.rules import param_partition_spec


@pytest.fixture(scope="module")
def tp(tmp_path_factory) -> dict:
    return run_check("tensor_parallel", tmp_path_factory.mktemp("tp"))


def test_tp2_and_tp4_greedy_tokens_equal_tp1(tp):
    assert tp["llama_tp1"] == tp["llama_tp2"] == tp["llama_tp4"]
    assert tp["qwen3_tp1"] == tp["qwen3_tp2"]


def test_param_and_kv_shardings_follow_the_rules(tp):
    two = tp["llama_tp2_specs"]
    assert two["fused"] == ["qkv_proj"]  # tp 2 divides the 2 KV heads: q/k/v fused
    assert two["q_proj"] == [None, None, "model"] and two["gate_proj"] == [None, None, "model"]
    assert two["o_proj"] == [None, "model"] and two["down_proj"] == [None, "model"]
    assert two["k_proj"] == [None, None, "model"]
    assert two["embed_tokens"] == ["model"]
    assert two["input_norm"] == []
    assert two["kv_cache"] == [None, None, None, "model"]


def test_tp_above_num_kv_heads_replicates_kv_heads_and_cache(tp):
    four = tp["llama_tp4_specs"]
    assert four["fused"] == []  # KV replicated while q splits: q/k/v stay separate
    assert four["k_proj"] == [] and four["kv_cache"] == []
    assert four["q_proj"] == [None, None, "model"]


def test_each_device_reads_only_its_slice_of_a_column_parallel_weight(tp):
    # HF q_proj.weight is [out=64, in=64]; column-parallel splits `out` (rows of the HF tensor); the fused q/k/v
    # param reads each part's range of rows (all 64 at tp 1, q's rows of each device's KV head at tp 2)
    assert tp["llama_tp1_q_proj_reads"] == [[[0, 64], [None, None]]]
    halves = sorted(r[0] for r in tp["llama_tp2_q_proj_reads"])
    assert halves == [[0, 32], [32, 64]]


def test_impossible_layouts_fail_at_start_up(tp):
    assert "must divide the model's num_attention_heads" in tp["error_tp3"]
    assert "needs 16 devices but only 8" in tp["error_tp16"]


def test_rules_replicate_a_dim_tp_does_not_divide():
    class Spec:
        num_heads, num_kv_heads = 4, 2

    assert tuple(param_partition_spec(("embed_tokens",), (321, 64), Spec, 2)) == ()
    assert tuple(param_partition_spec(("embed_tokens",), (320, 64), Spec, 2)) == ("model", None)


def test_orbax_converted_params_restore_into_tp2_unchanged_and_into_tp4_split(tmp_path):
    result = run_check("orbax", tmp_path)
    assert result["source_kind"] == "orbax"
    assert result["params_equal"]
    assert result["restored_tp2"] == result["direct"]
    assert result["restored_specs"]["q_proj"] == [None, None, "model"]
    # converted fused, restored where tp 4 keeps the projections separate: split at restore, layer 0 checked
    assert result["tp4_fused"] == [] and result["tp4_parts_equal"]
    assert result["restored_tp4"] == result["direct"]


def test_two_processes_with_tp_across_both_match_one_process(tmp_path):
    from tests.helpers.parallel_workload import ENGINE_ARGS, prompts
    from tests.helpers.tiny_models import make_tiny_checkpoint
    from vllm_jax import LLM, SamplingParams

    make_tiny_checkpoint("llama", tmp_path, seed=6)
    two_process = last_json(run_two_jax_processes("tests.helpers.multihost_process", str(tmp_path)))
    single = LLM(str(tmp_path), **ENGINE_ARGS).generate(
        prompts(), SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    assert two_process == [o.outputs[0].token_ids for o in single]


def test_expert_parallel_on_4_devices_equals_ep_off_and_one_device(tmp_path):
    result = run_check("expert_parallel", tmp_path)
    for arch in ("mixtral", "qwen3_moe"):
        assert result[f"{arch}_tp4_ep"] == result[f"{arch}_tp4"] == result[f"{arch}_tp1"], arch
        assert result[f"{arch}_ep_spec"] == [None, "model"], arch  # [L, E, H, I]: experts split


def test_gpt_oss_tp2_pallas_tp2_and_ep4_equal_one_device(tmp_path):
    """Tiny gpt-oss: TP 2 (GSPMD, and the TPU kernel in interpret mode with the sinks split inside shard_map)
    and TP 4 with expert parallelism give TP 1's greedy tokens; sinks split with the q heads, the fused gate_up
    on its interleaved columns (TP) or its experts (EP), the expert biases with their experts."""
    result = run_check("gpt_oss_parallel", tmp_path)
    assert result["tp2"] == result["tp2_pallas_tpu"] == result["tp4_ep"] == result["tp1"]
    assert result["tp2_sinks_spec"] == [None, "model"]
    assert result["tp2_gate_up_spec"] == [None, None, None, "model"]
    assert result["ep_gate_up_spec"] == result["ep_down_bias_spec"] == [None, "model"]


def test_gpt_oss_mxfp4_experts_shard_like_float_ones(tmp_path):
    """MXFP4 experts dequantized per device slice: TP 2 and TP 4 with EP give TP 1's greedy tokens, TP 2 reads half
    of gate_up's 128 output rows of blocks for all 4 experts, EP one expert's whole blocks."""
    result = run_check("gpt_oss_mxfp4_parallel", tmp_path)
    assert result["tp2"] == result["tp4_ep"] == result["tp1"]
    assert result["tp2_reads"] == [[4, 64]] and result["ep_reads"] == [[1, 128]]


def test_dp2_tp2_on_4_devices_answers_concurrent_requests_like_one_engine(tmp_path):
    result = run_check("data_parallel", tmp_path)
    assert result["dp"] == result["single"] * 2
    assert all(n > 0 for n in result["served"]) and sum(result["served"]) == 6
    assert result["replica_devices"] == [[0, 1], [2, 3]]

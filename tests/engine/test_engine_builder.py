"""One construction (worker/engine_builder.py): `vllm-jax compile-check` compiles the runner's own programs.

The abstract engine (compile-check's) and the runner come from the same `build_engine`: for a plain config, a
draft model, an EAGLE-3 head and LoRA, the program list compile-check compiles is warm-up's, over params of the
same shapes, dtypes and shardings; and a config the runner refuses (an expert count tensor parallelism does not
divide) is refused by compile-check with the same message, where its twin once set up expert parallelism anyway.
"""

from __future__ import annotations

import jax
import pytest

from tests.helpers.tiny_models import make_tiny_checkpoint, make_tiny_eagle3_head
from vllm_jax.aot import targets
from vllm_jax.aot.engine_programs import engine_plan
from vllm_jax.aot.model_configs import write_config
from vllm_jax.config import EngineArgs
from vllm_jax.worker.engine_builder import build_engine
from vllm_jax.worker.model_runner import ModelRunner

SMALL = dict(max_model_len=128, block_size=8, max_num_seqs=8, max_num_batched_tokens=32, compilation_cache=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("builder")
    make_tiny_checkpoint("llama", root / "target", num_hidden_layers=4)  # the head reads layers 0, 1 and 3
    return {"target": str(root / "target"),
            "head": str(make_tiny_eagle3_head(root / "head", aux_layers=(0, 1, 3)))}


def _extra(case: str, models: dict) -> dict:
    spec = {"num_speculative_tokens": 2, "disable_by_batch_size": 64}
    return {"plain": {},
            # k = 4 at max_num_seqs 1: the proposals' logits rows get sequence buckets of their own (issue #38)
            "draft_model": {"speculative_config": {"method": "draft_model", "model": models["target"], **spec,
                                                   "num_speculative_tokens": 4}, "max_num_seqs": 1},
            "eagle3": {"speculative_config": {"method": "eagle3", "model": models["head"], **spec}},
            "lora": {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8},
            "pooling": {"runner": "pooling", "convert": "embed", "pooler_config": {"pooling_type": "MEAN"}},
            "multistep": {"num_scheduler_steps": 4}}[case]


def _leaves(tree) -> list[tuple]:
    return [(x.shape, str(x.dtype), getattr(x.sharding, "spec", None)) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("case", ["plain", "draft_model", "eagle3", "lora", "pooling", "multistep"])
def test_compile_check_compiles_the_programs_warm_up_makes_ready(models, case):
    config = EngineArgs(model=models["target"], **{**SMALL, **_extra(case, models)}).create_config()
    runner = ModelRunner(config)  # the checkpoint's weights, loaded and placed
    engine = build_engine(config, targets.get_target("cpu").devices, abstract=True)
    labels = [label for label, _ in engine_plan(engine, runner.num_blocks)]
    assert labels == [label for label, _ in runner.warmup_plan()]
    assert any(label.split()[0] == {"plain": "forward", "draft_model": "draft", "eagle3": "draft",
                                    "lora": "lora", "pooling": "pooler", "multistep": "multistep"}[case]
               for label in labels)
    assert engine.max_blocks_per_seq == runner.max_blocks_per_seq
    params = {"runner": [runner.params], "engine": [engine.params]}
    if case in ("draft_model", "eagle3"):
        params["runner"].append((runner.drafter or runner.eagle).params)
        params["engine"].append(engine.speculator.params)
    assert _leaves(params["engine"]) == _leaves(params["runner"])
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(params["runner"]))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params["engine"]))
    assert runner.num_compilations == 0  # building the abstract engine compiled nothing of the runner's


MOE = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=320, hidden_size=64,
           intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=16, num_experts=3, num_experts_per_tok=2, max_position_embeddings=256,
           rms_norm_eps=1e-6, tie_word_embeddings=False)
def test_compile_check_refuses_an_expert_count_tp_does_not_divide_as_the_runner_does(tmp_path):
    """3 experts over tp 2 with --enable-expert-parallel (two of the session's fake CPU devices)."""
    from vllm_jax.aot.engine_programs import check_target

    args = EngineArgs(model=str(write_config(tmp_path / "moe", MOE)), tensor_parallel_size=2,
                      enable_expert_parallel=True, max_model_len=128, max_num_seqs=8, max_num_batched_tokens=16,
                      compilation_cache=False)
    with pytest.raises(ValueError) as refused:
        ModelRunner(args.create_config(), random_weights=True)
    result = {"runner": str(refused.value), "compile_check": check_target(args, "cpu:2").refused}
    assert "needs num_experts (3) to be a multiple of it" in result["runner"]
    assert result["compile_check"] == result["runner"]

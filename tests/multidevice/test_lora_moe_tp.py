"""LoRA on a MoE model under tensor and expert parallelism (docs/architecture/11-lora.md, "Mixture-of-experts
models"), on 2 of the session's fake CPU devices: TP 2 and TP 2 with EP give, for a batch mixing the base model, an
attention adapter and expert adapters (per-expert and fused layouts), the reference's greedy tokens (what TP 1
gives: tests/engine/test_lora_moe.py), with the expert slots split like the experts."""

from __future__ import annotations

import pytest

from tests.helpers.lora_moe_models import MAX_TOKENS, greedy, make_engine, make_models, prompts
from tests.helpers.tiny_models import hf_greedy


def _spec(array) -> list:
    parts = list(array.sharding.spec)
    while parts and parts[-1] is None:
        parts.pop()
    return parts


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_tp2_and_expert_parallel_equal_the_reference(tmp_path, expert_parallel):
    refs = make_models(tmp_path, "qwen3_moe")
    engine, loras = make_engine(tmp_path, tensor_parallel_size=2, enable_expert_parallel=expert_parallel)
    names = ["E", "A", None, "F"]
    ps = prompts(6, (5, 9, 7, 12))
    assert greedy(engine, ps, [loras[n] for n in names]) == [hf_greedy(refs[n], p, MAX_TOKENS)
                                                             for n, p in zip(names, ps)]
    arrays = engine.runner.device.lora.arrays
    specs = {name: [_spec(a), _spec(b)] for name, (a, b) in arrays.items()}
    if expert_parallel:  # the expert axis (2 of [L, N, E, ...]) on "model", like the experts' own
        assert specs["experts_gate"] == specs["experts_down"] == [[None, None, "model"]] * 2
    else:  # like their base layer: gate / up column-parallel (b on out), down row-parallel (a on in)
        assert specs["experts_gate"] == specs["experts_up"] == [[], [None, None, None, None, "model"]]
        assert specs["experts_down"] == [[None, None, None, "model"], []]
    assert specs["q_proj"] == [[], [None, None, None, "model"]]

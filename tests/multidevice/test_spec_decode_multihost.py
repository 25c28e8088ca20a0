"""Draft-model and EAGLE-3 speculation in a multi-host run: two jax processes on 127.0.0.1 with tp 2 across both
(process 0 broadcasts each proposal step's inputs, the other runs the same program: spec_decode/device/proposals.py)
give one process's greedy tokens without speculation. One pair of processes serves both engines in turn."""

from __future__ import annotations

import json

from tests.helpers.parallel_workload import ENGINE_ARGS, prompts
from tests.helpers.processes import last_json, run_two_jax_processes
from tests.helpers.tiny_models import make_tiny_checkpoint, make_tiny_eagle3_head
from vllm_jax import LLM, SamplingParams


def test_draft_model_and_eagle3_across_two_processes_match_one_process(tmp_path):
    target = tmp_path / "target"
    make_tiny_checkpoint("llama", target, seed=6, num_hidden_layers=4)  # the head reads layers 0, 1 and 3
    head = make_tiny_eagle3_head(tmp_path / "head")
    # the target as its own draft: every proposal is accepted, so the accepted runs cross the processes too
    specs = {"draft_model": {"method": "draft_model", "model": str(target), "num_speculative_tokens": 2,
                             "disable_by_batch_size": 64},
             "eagle3": {"method": "eagle3", "model": str(head), "num_speculative_tokens": 2,
                        "disable_by_batch_size": 64}}
    two_process = last_json(run_two_jax_processes("tests.helpers.multihost_spec_process", str(target),
                                                  json.dumps(specs)))
    single = LLM(str(target), **ENGINE_ARGS).generate(
        prompts(), SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    expected = [o.outputs[0].token_ids for o in single]
    for name in specs:
        assert two_process[name]["tokens"] == expected, name
        assert two_process[name]["drafted"] > 0, name
    draft = two_process["draft_model"]
    assert draft["accepted"] == draft["drafted"]

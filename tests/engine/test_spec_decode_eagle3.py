"""Speculative decoding with an EAGLE-3 head (`"method": "eagle3"`): the engine runs the head on the target's
auxiliary hidden states, greedy output identical to no speculation over batching, chunked prefill and
preemption; proposals accepted where the head is right; its KV cache shares the target's blocks (all free
afterwards); no compilation after warm-up; a head that does not fit the target refused at start-up naming the
key. (The head's arithmetic against a dense reference: tests/engine/test_eagle3_head.py.)"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tests.helpers.spec_checks import check_idle, token_ids
from tests.helpers.tiny_models import VOCAB_SIZE, make_tiny_checkpoint, make_tiny_eagle3_head
from vllm_jax import LLM, SamplingParams

# One token and one sequence bucket (docs/contributing/testing.md, "Compile time"): min_seq_bucket at the step's
# tokens, the most rows a speculating step holds (the engine caps it at its max rows).
ARGS = dict(max_model_len=128, block_size=8, num_gpu_blocks_override=160, max_num_seqs=8,
            max_num_batched_tokens=32, min_token_bucket=32, min_seq_bucket=32)
PARAMS = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def _spec(head: str, k: int = 3) -> dict:
    return {"method": "eagle3", "model": head, "num_speculative_tokens": k, "disable_by_batch_size": 64}


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB_SIZE, int(rng.integers(5, 30))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A 4-layer target (the head reads layers 0, 1 and 3), its greedy outputs, and two heads: a random one, and
    one whose draft vocabulary is the single token the target emits most, so it is right some of the time."""
    root = tmp_path_factory.mktemp("eagle3_spec")
    make_tiny_checkpoint("llama", root / "target", seed=5, num_hidden_layers=4)
    baseline = LLM(str(root / "target"), **ARGS)
    prompts = _prompts(8)
    expected = token_ids(baseline, prompts, PARAMS)
    frequent, count = Counter(sum(expected, [])).most_common(1)[0]
    assert count >= 8, "the workload needs a repeated token for the fixed head to be right"
    heads = {"random": make_tiny_eagle3_head(root / "random"),
             "fixed": make_tiny_eagle3_head(root / "fixed", draft_to_target=[frequent])}
    return dict(target=str(root / "target"), prompts=prompts, expected=expected,
                heads={name: str(path) for name, path in heads.items()}, baseline=baseline)


@pytest.mark.parametrize("case", ["plain", "preempting"])  # chunked prompts: the wiring test below
def test_greedy_output_is_identical_and_right_proposals_are_accepted(setup, case):
    args = dict(ARGS)
    if case == "preempting":
        args.update(num_gpu_blocks_override=12, max_model_len=64)  # 11 blocks of 8 for 8 requests
    llm = LLM(setup["target"], speculative_config=_spec(setup["heads"]["fixed"]), **args)
    compiled = llm.llm_engine.runner.num_compilations
    prompts = setup["prompts"] + [setup["prompts"][0] + [5, 6]]  # a prefix-cache hit
    assert token_ids(llm, prompts, PARAMS) == token_ids(setup["baseline"], prompts, PARAMS)
    counts = llm.llm_engine.scheduler.spec_decode_counts
    assert 0 < counts.num_accepted_tokens < counts.num_draft_tokens
    assert llm.llm_engine.runner.num_compilations == compiled
    if case == "preempting":
        assert llm.llm_engine.scheduler.num_preemptions_total > 0
    check_idle(llm)


def test_one_proposal_per_step_changes_nothing(setup):
    """k = 1: the head's catch-up proposes, no chain runs."""
    llm = LLM(setup["target"], speculative_config=_spec(setup["heads"]["fixed"], 1), **ARGS)
    assert token_ids(llm, setup["prompts"], PARAMS) == setup["expected"]
    assert llm.llm_engine.scheduler.spec_decode_counts.num_accepted_tokens > 0
    check_idle(llm)


def test_a_head_for_another_model_is_refused_naming_the_key(setup, tmp_path):
    wide = make_tiny_eagle3_head(tmp_path / "wide", target_hidden=128)
    with pytest.raises(ValueError, match=r"speculative_config.model .* target_hidden_size is 128, the target's is 64"):
        LLM(setup["target"], speculative_config=_spec(str(wide)), **ARGS)
    deep = make_tiny_eagle3_head(tmp_path / "deep", aux_layers=(0, 1, 9))
    with pytest.raises(ValueError, match=r"speculative_config.model .* auxiliary layers"):
        LLM(setup["target"], speculative_config=_spec(str(deep)), **ARGS)
    with pytest.raises(ValueError, match=r"speculative_config.model .*config.json"):
        (tmp_path / "broken").mkdir()
        (tmp_path / "broken" / "config.json").write_text("{}")
        (tmp_path / "broken" / "model.safetensors").write_bytes(b"")
        LLM(setup["target"], speculative_config=_spec(str(tmp_path / "broken")), **ARGS)


def test_proposals_are_the_heads_own_greedy_chain(setup):
    """The wiring, against a dense reference: after any step, a request's proposals are what the head computes
    over its whole known sequence (position p fed token p + 1 and the target's states entering layers 0, 1, 3
    at p, through fc), then fed its own proposals and output states. Ragged batches, chunked prompts and rejected
    proposals all go through the engine's catch-up first."""
    import torch
    from safetensors.numpy import load_file
    from transformers import LlamaForCausalLM

    from tests.engine.test_eagle3_head import _reference

    head_dir = setup["heads"]["random"]
    llm = LLM(setup["target"], speculative_config=_spec(head_dir), **dict(ARGS, max_num_batched_tokens=8,
                                                                                min_token_bucket=8))
    runner = llm.llm_engine.runner
    records: list[tuple[list[int], list[int]]] = []
    propose = runner._propose

    def recording(step, update, sampled):
        out = propose(step, update, sampled)
        batch = runner.input_batch
        for req_id, proposal in out.items():
            slot = batch.slot_of[req_id]
            records.append((batch.token_ids[slot, :batch.num_tokens[slot]].tolist(), proposal))
        return out

    runner._propose = recording
    compiled = runner.num_compilations
    # a random head: its proposals are almost all rejected, so the catch-up drops tokens every step
    assert token_ids(llm, setup["prompts"], PARAMS) == setup["expected"]
    assert runner.num_compilations == compiled
    check_idle(llm)
    assert len(records) >= 9
    target = LlamaForCausalLM.from_pretrained(setup["target"]).eval()
    tensors = load_file(f"{head_dir}/model.safetensors")
    fc = tensors["fc.weight"]
    for tokens, proposal in records[::10]:
        with torch.no_grad():
            states = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states
        aux = np.concatenate([states[i][0].numpy() for i in (0, 1, 3)], axis=-1)[:-1]  # positions 0..L-2
        head_tokens, features = tokens[1:], aux @ fc.T
        expected = []
        for _ in range(len(proposal)):
            hidden, logits = _reference(tensors, head_tokens, features, False, tensors["embed_tokens.weight"], False)
            expected.append(int(np.argmax(logits[-1])))  # d2t is the identity for this head
            head_tokens = head_tokens + [expected[-1]]
            features = np.concatenate([features, hidden[-1:]])
        assert proposal == expected, (tokens, proposal, expected)


def _greedy_with_proposals(setup, tp: int):
    """Greedy tokens of 4 prompts with the random head at tensor_parallel_size `tp` (one bucket and no warm-up:
    few programs compile), every step's proposals, and the engine."""
    from vllm_jax import EngineArgs
    from vllm_jax.engine.llm_engine import LLMEngine

    args = EngineArgs(model=setup["target"], speculative_config=_spec(setup["heads"]["random"]),
                      tensor_parallel_size=tp, **ARGS)
    engine = LLMEngine(args.create_config(), warmup=False)
    runner, proposals = engine.runner, []
    propose = runner._propose

    def recording(step, update, sampled):
        proposals.append(propose(step, update, sampled))
        return proposals[-1]

    runner._propose = recording
    for i, prompt in enumerate(setup["prompts"][:4]):
        engine.add_request(str(i), prompt, PARAMS)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        tokens.update((out.request_id, out.outputs[0].token_ids) for out in engine.step() if out.finished)
    return [tokens[str(i)] for i in range(4)], proposals, engine

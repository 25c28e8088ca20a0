"""Speculative decoding with a draft model (`"method": "draft_model"`): greedy output identical to no speculation
over batching, chunked prefill, prefix caching and preemption; a draft identical to the target has every
proposal accepted; sampled output exact in distribution; the draft's KV cache shares the target's blocks (all
free afterwards); no compilation after warm-up; bad drafts refused at start-up naming the key."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.helpers.spec_checks import check_idle, token_ids
from tests.helpers.tiny_models import VOCAB_SIZE, make_tiny_checkpoint
from vllm_jax import LLM, EngineArgs, SamplingParams
from vllm_jax.spec_decode.device.draft_chain import pack_chain

# One token and one sequence bucket (docs/contributing/testing.md, "Compile time"): min_seq_bucket at the step's
# tokens, the most rows a speculating step holds (the engine caps it at its max rows).
ARGS = dict(max_model_len=128, block_size=8, num_gpu_blocks_override=160, max_num_seqs=8,
            max_num_batched_tokens=32, min_token_bucket=32, min_seq_bucket=32)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft_spec")
    make_tiny_checkpoint("llama", root / "target", seed=5)
    # Two random models never agree; this draft is the target with noise on every weight, so its greedy tokens
    # match the target's some of the time (neither always nor never).
    shutil.copytree(root / "target", root / "draft")
    weights = root / "draft" / "model.safetensors"
    rng = np.random.default_rng(0)
    tensors = {name: (value + rng.normal(0, 0.6 * value.std() + 1e-3, value.shape)).astype(value.dtype)
               for name, value in load_file(weights).items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    return {name: str(root / name) for name in ("target", "draft")}


def _spec(model: str, k: int = 3) -> dict:
    # disable_by_batch_size: the CPU default (4) would switch proposals off in these batches
    return {"method": "draft_model", "model": model, "num_speculative_tokens": k, "disable_by_batch_size": 64}


@pytest.fixture(scope="module")
def baseline(models):
    return LLM(models["target"], **ARGS)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB_SIZE, int(rng.integers(5, 40))).tolist() for _ in range(n)]


def test_a_draft_equal_to_the_target_has_every_proposal_accepted(models, baseline):
    llm = LLM(models["target"], speculative_config=_spec(models["target"]), **ARGS)
    prompts = _prompts(8)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    compiled = llm.llm_engine.runner.num_compilations
    assert token_ids(llm, prompts, params) == token_ids(baseline, prompts, params)
    counts = llm.llm_engine.scheduler.spec_decode_counts
    assert counts.num_draft_tokens > 8 * 24 // 2  # most tokens came as proposals
    assert counts.num_accepted_tokens == counts.num_draft_tokens
    assert llm.llm_engine.runner.num_compilations == compiled
    check_idle(llm)


@pytest.mark.parametrize("case", ["plain", "chunked", "preempting"])  # no prefix caching: test_spec_decode.py
def test_greedy_output_is_identical_across_engine_configurations(models, baseline, case):
    args = dict(ARGS)
    if case == "chunked":
        args.update(max_num_batched_tokens=8, min_token_bucket=8)  # prompts arrive in chunks: the draft catches up
    elif case == "preempting":
        args.update(num_gpu_blocks_override=17)  # 16 blocks of 8 for 8 requests of up to 64 tokens
    llm = LLM(models["target"], speculative_config=_spec(models["draft"]), **args)
    prompts = _prompts(10, seed=1)
    prompts += [prompts[0] + [5, 6], prompts[0] + [7]]  # prefix-cache hits: the draft's KV is shared too
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    compiled = llm.llm_engine.runner.num_compilations
    assert token_ids(llm, prompts, params) == token_ids(baseline, prompts, params)
    assert llm.llm_engine.runner.num_compilations == compiled
    counts = llm.llm_engine.scheduler.spec_decode_counts
    assert counts.num_draft_tokens > 0
    if case == "plain":
        assert 0 < counts.num_accepted_tokens < counts.num_draft_tokens
    if case == "preempting":
        assert llm.llm_engine.scheduler.num_preemptions_total > 0
    check_idle(llm)


def test_sampled_output_matches_the_targets_distribution(models):
    """Exactness in distribution with draft proposals: the draft is the target, so its greedy proposal is the
    target's most likely token and is accepted with that token's probability. Four allowed tokens, temperature 1:
    every output position's empirical distribution with speculation matches the one without (chi-square)."""
    from scipy import stats as scipy_stats

    args = dict(ARGS, max_num_seqs=32, max_num_batched_tokens=128, num_gpu_blocks_override=400, min_token_bucket=128,
                min_seq_bucket=128)
    allowed = [11, 57, 130, 201]
    prompt = np.random.default_rng(6).choice(allowed, 20).tolist()
    llms = {"off": LLM(models["target"], **args),
            "on": LLM(models["target"], speculative_config=_spec(models["target"]), **args)}
    num = 800
    seeds = {"off": 1000, "on": 50_000}
    samples = {mode: np.array(token_ids(llm, [prompt] * num, [
        SamplingParams(temperature=1.0, allowed_token_ids=allowed, seed=seeds[mode] + i, max_tokens=4,
                       ignore_eos=True) for i in range(num)])) for mode, llm in llms.items()}
    counts = llms["on"].llm_engine.scheduler.spec_decode_counts
    assert counts.num_drafts >= num and 0 < counts.num_accepted_tokens < counts.num_draft_tokens
    for position in range(4):
        table = np.array([[np.sum(samples[mode][:, position] == t) for t in allowed] for mode in ("off", "on")])
        assert scipy_stats.chi2_contingency(table)[1] > 1e-3, (position, table)


def test_chain_stops_at_the_slots_a_row_holds():
    """Positions past a row's blocks (or max_model_len) repeat its last slot and their proposals are cut."""
    block_size, k = 4, 3
    tokens = np.arange(40, dtype=np.int32).reshape(2, 20)
    chain = pack_chain(tokens, np.array([5, 11]), np.array([[3, 4, 0], [6, 7, 9]], np.int32), np.array([2, 3]),
                       k=k, block_size=block_size, max_model_len=12, num_tokens_padded=4, num_seqs_padded=2)
    inputs = chain.inputs
    assert inputs.first_token_ids.tolist() == [4, 30, 0, 0]  # each row's newest token
    assert inputs.positions[:, :2].tolist() == [[4, 10], [5, 11], [6, 11]]
    # row 0: positions 4..6 in block 4; row 1: 10, 11 in block 9 (its third block), then 11 again
    assert inputs.slot_mapping[:, :2].tolist() == [[16, 38], [17, 39], [18, 39]]
    assert inputs.seq_lens.tolist() == [[5, 11], [6, 12], [7, 12]]
    assert chain.num_valid.tolist() == [3, 2]
    assert inputs.slot_mapping[:, 2:].tolist() == [[0, 0]] * k  # padding tokens write the null block


def test_bad_draft_models_are_refused_naming_the_key(models, tmp_path):
    other_vocab = tmp_path / "other_vocab"
    make_tiny_checkpoint("llama", other_vocab, vocab_size=VOCAB_SIZE + 64)
    with pytest.raises(ValueError, match=r"speculative_config.model .* another vocabulary.*384 vs 320"):
        EngineArgs(model=models["target"], speculative_config=_spec(str(other_vocab)), **ARGS).create_config()
    short = tmp_path / "short"
    make_tiny_checkpoint("llama", short, max_position_embeddings=64)
    with pytest.raises(ValueError, match=r"speculative_config.model .* 64 positions"):
        EngineArgs(model=models["target"], speculative_config=_spec(str(short)), **ARGS).create_config()
    unknown = tmp_path / "unknown_arch"
    make_tiny_checkpoint("llama", unknown)
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps(config | {"architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(ValueError, match=r"speculative_config.model .*unsupported model architecture"):
        LLM(models["target"], speculative_config=_spec(str(unknown)), **ARGS)

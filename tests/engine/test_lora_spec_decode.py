"""LoRA together with speculative decoding (docs/lora.md, docs/speculative-decoding.md): the target's
verification pass runs each request's adapter; n-gram proposals need nothing, the draft model and the EAGLE-3
head propose without adapters (as vLLM's). A batch mixing two adapters and base requests gives every request the
greedy tokens it gets with speculation off; seeded sampling is reproducible and independent of the batch, and
in distribution the target's (rejection sampling is unchanged: tests/engine/test_spec_decode.py).

Also sleep mode over what such an engine holds besides the target (docs/architecture/05-worker.md, "Sleep and
weight updates"): the draft's weights and KV cache and the LoRA slots; sleep, wake, same tokens, nothing compiled.

Engines run without warm-up (each compiles what its workload uses), one per method, shared by the module."""

from __future__ import annotations

import itertools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.engine.test_lora import make_adapter
from tests.helpers.spec_checks import check_idle, token_ids
from tests.helpers.tiny_models import VOCAB_SIZE, make_tiny_checkpoint, make_tiny_eagle3_head
from vllm_jax import LLM, EngineArgs, LoRARequest, SamplingParams
from vllm_jax.engine.llm_engine import LLMEngine
from vllm_jax.worker.sleep import DeviceSleep

# 4 prompts of 4 tokens: the prefill and every verification step fit one 16-token bucket; one token and one
# sequence bucket (min_seq_bucket at the step's tokens, which the engine caps at its max rows): few programs compile
ARGS = dict(max_model_len=64, block_size=8, num_gpu_blocks_override=40, max_num_seqs=4, max_num_batched_tokens=16,
            min_token_bucket=16, min_seq_bucket=16, enable_lora=True, max_loras=2, max_lora_rank=8)
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
ADAPTERS = [None, "A", "B", "A"]


def cold_llm(model: str, **kwargs) -> LLM:
    """An LLM without warm-up: its workload compiles what it uses (the tests count compilations after that)."""
    llm = LLM.__new__(LLM)
    llm.llm_engine = LLMEngine(EngineArgs(model=model, **{**ARGS, **kwargs}).create_config(), warmup=False,
                               show_progress=False)
    llm._counter = itertools.count()
    return llm


def spec(method: str, model: str | None = None) -> dict:
    # disable_by_batch_size: the CPU default (4) would switch proposals off in these batches
    config = {"method": method, "num_speculative_tokens": 3, "disable_by_batch_size": 64}
    if model is None:
        return config | {"prompt_lookup_max": 3, "prompt_lookup_min": 1}
    return config | {"model": model}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A 4-layer target (an EAGLE-3 head reads layers 0, 1, 3), two adapters on different targets, an EAGLE-3
    head, and the engine without speculation. The draft model is the target itself: base requests accept every
    proposal, adapter requests (the draft has no adapter) reject some."""
    root = tmp_path_factory.mktemp("lora_spec")
    base = make_tiny_checkpoint("llama", root / "target", seed=5, num_hidden_layers=4)
    make_adapter(base, root / "A", 1, 8, ["q_proj", "v_proj", "o_proj", "down_proj"])
    make_adapter(base, root / "B", 2, 4, ["k_proj", "gate_proj", "up_proj"])
    make_tiny_eagle3_head(root / "head")
    lora = {name: LoRARequest(name, i, str(root / name)) for i, name in enumerate("AB", start=1)}
    return dict(target=str(root / "target"), head=str(root / "head"), lora=lora,
                off=cold_llm(str(root / "target")), engines={})


def engine(setup, method: str) -> LLM:
    if method not in setup["engines"]:
        model = {"ngram": None, "draft_model": setup["target"], "eagle3": setup["head"]}[method]
        setup["engines"][method] = cold_llm(setup["target"], speculative_config=spec(method, model),
                                            enable_sleep_mode=True)
    return setup["engines"][method]


def repetitive_prompts(n: int, seed: int) -> list[list[int]]:
    """4-token prompts repeating a 2-token phrase, so n-gram proposals find matches."""
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB_SIZE, 2).tolist() * 2 for _ in range(n)]


def generate(llm: LLM, setup, prompts, params) -> list[list[int]]:
    lora = [setup["lora"][name] if name else None for name in ADAPTERS[:len(prompts)]]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False, lora_request=lora)]


@pytest.mark.parametrize("method", ["ngram", "draft_model", "eagle3"])
def test_mixed_adapter_batch_gives_the_tokens_of_no_speculation(setup, method):
    llm = engine(setup, method)
    prompts = repetitive_prompts(4, seed=3)
    expected = generate(setup["off"], setup, prompts, GREEDY)
    base_only = token_ids(setup["off"], prompts[1:3], GREEDY)
    assert base_only != expected[1:3]  # the adapters change these continuations
    counts = llm.llm_engine.scheduler.spec_decode_counts
    assert generate(llm, setup, prompts, GREEDY) == expected
    assert counts.num_draft_tokens > 0
    if method != "eagle3":  # the random head is rarely right
        assert counts.num_accepted_tokens > 0
    if method == "draft_model":  # the draft (the target without adapters) is wrong for the adapters' requests
        assert counts.num_accepted_tokens < counts.num_draft_tokens
    check_idle(llm)


def test_seeded_sampling_with_adapters_is_reproducible_and_batch_independent(setup):
    llm = engine(setup, "ngram")
    prompts = repetitive_prompts(4, seed=4)
    params = [SamplingParams(temperature=0.8, seed=20 + i, max_tokens=10, ignore_eos=True) for i in range(4)]
    batched = generate(llm, setup, prompts, params)
    alone = [o.outputs[0].token_ids for o in llm.generate(
        [prompts[1]], params[1], use_tqdm=False, lora_request=setup["lora"]["A"])]
    assert alone[0] == batched[1]
    assert generate(llm, setup, prompts, params) == batched
    check_idle(llm)


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_sleep_and_wake_restore_the_speculator_and_the_lora_slots(setup, method):
    """#33: level 1 and level 2 (the target's weights updated from its own checkpoint while asleep): the same
    greedy tokens for base and adapter requests, the engine's device bytes 0 while asleep, nothing compiled."""
    llm = engine(setup, method)
    prompts = repetitive_prompts(4, seed=5)
    before = generate(llm, setup, prompts, GREEDY)
    runner = llm.llm_engine.runner
    compiled = runner.num_compilations
    assert runner.device.lora.resident  # adapters sit in the slots
    for level in (1, 2):
        llm.sleep(level=level)
        assert runner.sleep_mode.device_bytes() == 0
        if level == 2:
            llm.llm_engine.update_weights(setup["target"])
        llm.wake_up()
        assert generate(llm, setup, prompts, GREEDY) == before, level
    assert runner.num_compilations == compiled
    check_idle(llm)


def test_a_head_reading_the_target_embedding_follows_it_through_sleep(setup):
    """An EAGLE-3 head without its own embedding holds the target's array (spec_decode/device/speculators.py): sleep
    must not leave it the deleted one. A stand-in head on the n-gram engine's device step, level 1 and back."""
    runner = engine(setup, "ngram").llm_engine.runner
    embed = nnx.to_pure_dict(runner.params)["embed_tokens"]
    values = np.asarray(embed)
    head = types.SimpleNamespace(params=nnx.State({"w": nnx.Param(jnp.arange(3.0))}), kv_cache=jnp.ones(4),
                                 embed_tokens=embed)
    sleep = DeviceSleep(runner.device, head)
    sleep.sleep(level=1)
    assert embed.is_deleted() and isinstance(head.embed_tokens, jax.ShapeDtypeStruct)
    assert sleep.device_bytes() == 0
    sleep.wake_up()
    assert head.embed_tokens is nnx.to_pure_dict(runner.params)["embed_tokens"]
    np.testing.assert_array_equal(np.asarray(head.embed_tokens), values)
    np.testing.assert_array_equal(np.asarray(head.params["w"].get_value()), [0.0, 1.0, 2.0])
    assert not np.asarray(head.kv_cache).any()


def test_sampled_adapter_output_keeps_the_targets_distribution(setup):
    """#37 item 1, bounded: an adapter request restricted to 4 tokens (allowed_token_ids: the full sampler variant
    verifies) continuing a prompt of those tokens, so n-gram proposals are often accepted: each output position's
    empirical distribution with speculation matches the one without (two-sample chi-square, as
    tests/engine/test_spec_decode.py's test for the base model; 160 samples a side, ~7 s with the module's engines
    compiled, catch a gross bias, not a subtle one)."""
    from scipy import stats as scipy_stats  # jax depends on scipy

    allowed, num = [11, 57, 130, 201], 160
    prompt = [11, 57, 11, 57]
    llms = {"off": setup["off"], "on": engine(setup, "ngram")}
    seeds = {"off": 1000, "on": 50_000}  # independent samples: the same seeds would share their noise
    counts = llms["on"].llm_engine.scheduler.spec_decode_counts
    drafts, accepted = counts.num_drafts, counts.num_accepted_tokens
    samples = {mode: np.array([o.outputs[0].token_ids for o in llm.generate(
        [prompt] * num, [SamplingParams(temperature=1.0, allowed_token_ids=allowed, seed=seeds[mode] + i,
                                        max_tokens=4, ignore_eos=True) for i in range(num)],
        use_tqdm=False, lora_request=setup["lora"]["A"])]) for mode, llm in llms.items()}
    assert counts.num_drafts - drafts >= num // 2 and counts.num_accepted_tokens - accepted > num // 8
    for position in range(4):
        table = np.array([[np.sum(samples[mode][:, position] == t) for t in allowed] for mode in ("off", "on")])
        table = table[:, table.sum(axis=0) > 0]
        assert scipy_stats.chi2_contingency(table)[1] > 1e-3, (position, table)
    check_idle(llms["on"])

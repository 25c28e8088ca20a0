"""Speculative decoding with n-gram proposals (vLLM's speculative_config): greedy output identical to no
speculation over batching, chunked prefill, prefix caching and preemption, every block freed, no compilation after
warm-up; sampled output exact in distribution; the bookkeeping (rollback, metrics counts, logprobs) right; bad
configurations refused naming the key."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.spec_checks import check_idle, token_ids
from tests.helpers.tiny_models import EOS_ID, VOCAB_SIZE, make_tiny_checkpoint
from vllm_jax import LLM, EngineArgs, SamplingParams

# disable_by_batch_size: the CPU default (4) would switch proposals off in these batches
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
         "disable_by_batch_size": 64}
# One token and one sequence bucket (docs/contributing/testing.md, "Compile time"): min_seq_bucket at the step's
# tokens, the most rows a speculating step holds (the engine caps it at its max rows).
ARGS = dict(max_model_len=128, block_size=8, num_gpu_blocks_override=160, max_num_seqs=8,
            max_num_batched_tokens=32, min_token_bucket=32, min_seq_bucket=32)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama_spec")
    make_tiny_checkpoint("llama", path, seed=5)
    return str(path)


@pytest.fixture(scope="module")
def engines(checkpoint):
    return {"off": LLM(checkpoint, **ARGS), "on": LLM(checkpoint, speculative_config=NGRAM, **ARGS)}


def _repetitive_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts that repeat a short phrase, so the n-gram proposer finds matches (and the tiny random model's
    greedy loops make many proposals right)."""
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(n):
        phrase = rng.integers(3, VOCAB_SIZE, int(rng.integers(3, 7))).tolist()
        prompts.append((phrase * 12)[:int(rng.integers(8, 40))])
    return prompts


def test_greedy_output_is_identical_and_proposals_are_accepted(engines):
    prompts = _repetitive_prompts(12)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    on = engines["on"]
    compiled = on.llm_engine.runner.num_compilations
    before = on.llm_engine.scheduler.spec_decode_counts.num_accepted_tokens
    assert token_ids(on, prompts, params) == token_ids(engines["off"], prompts, params)
    counts = on.llm_engine.scheduler.spec_decode_counts
    assert counts.num_accepted_tokens - before > 20, "the workload must exercise accepted proposals"
    assert counts.num_accepted_tokens < counts.num_draft_tokens  # and rejected ones
    per_pos = counts.num_accepted_tokens_per_pos
    assert len(per_pos) == 3 and sum(per_pos) == counts.num_accepted_tokens
    assert per_pos[0] >= per_pos[1] >= per_pos[2]  # position i is accepted only after position i - 1
    assert on.llm_engine.runner.num_compilations == compiled
    check_idle(on)


@pytest.mark.parametrize("case", ["chunked", "no_prefix_caching", "preempting", "four_seqs_k4", "one_seq_k4"])
def test_greedy_output_is_identical_across_engine_configurations(checkpoint, engines, case):
    """Including k = 4 at max_num_seqs 4 and 1 (issue #38: each verified token's logits row is bounded by the
    step's tokens, not by max_num_seqs)."""
    args, spec = dict(ARGS), NGRAM
    if case == "chunked":
        args.update(max_num_batched_tokens=8, min_token_bucket=8)  # prompts arrive in chunks; proposals compete
    elif case == "no_prefix_caching":
        args.update(enable_prefix_caching=False)
    elif case == "preempting":
        args.update(num_gpu_blocks_override=24)  # 23 blocks of 8 for 8 requests of up to 64 tokens
    elif case == "four_seqs_k4":
        args.update(max_num_seqs=4, max_num_batched_tokens=8)  # tokens run short: proposals are trimmed
        spec = {**NGRAM, "num_speculative_tokens": 4}
    else:
        args.update(max_num_seqs=1)
        spec = {**NGRAM, "num_speculative_tokens": 4}
    if case.endswith("_k4"):  # rows beyond max_num_seqs in the sequence buckets: the engine's default buckets
        del args["min_token_bucket"], args["min_seq_bucket"]
    llm = LLM(checkpoint, speculative_config=spec, **args)
    prompts = _repetitive_prompts(10, seed=1)
    prompts += [prompts[0] + [5, 6], prompts[0] + [7]]  # prefix-cache hits
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    compiled = llm.llm_engine.runner.num_compilations
    assert token_ids(llm, prompts, params) == token_ids(engines["off"], prompts, params)
    assert llm.llm_engine.runner.num_compilations == compiled
    assert llm.llm_engine.scheduler.spec_decode_counts.num_accepted_tokens > 0
    if case == "preempting":
        assert llm.llm_engine.scheduler.num_preemptions_total > 0
    if case == "one_seq_k4":  # steps of one request verifying several proposals: more rows than max_num_seqs
        counts = llm.llm_engine.scheduler.spec_decode_counts
        assert counts.num_draft_tokens > counts.num_drafts and llm.llm_engine.runner.max_rows == 5
    check_idle(llm)


def test_stops_logprobs_and_full_variant_requests_match_without_speculation(engines):
    """Stop tokens and strings landing inside an accepted run, logprobs of every accepted token, and requests
    that verify proposals under the full sampler variant (penalties, min_tokens, logit_bias) all give what they
    give without speculation."""
    prompts = _repetitive_prompts(8, seed=2)
    off = engines["off"]
    probe = token_ids(off, prompts[:2], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    stop_text = off.generate([prompts[1]], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
                             use_tqdm=False)[0].outputs[0].text[6:8]
    assert stop_text
    params = [
        SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[probe[0][9]]),
        SamplingParams(temperature=0.0, max_tokens=20, stop=[stop_text]),
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=0.0, max_tokens=16, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=16, min_tokens=8),
        SamplingParams(temperature=0.0, max_tokens=16, logit_bias={7: 3.0, 9: -100.0}, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, prompt_logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
    ]
    results = {mode: engines[mode].generate(prompts, params, use_tqdm=False) for mode in ("off", "on")}
    for a, b in zip(results["off"], results["on"]):
        ca, cb = a.outputs[0], b.outputs[0]
        assert (ca.token_ids, ca.text, ca.finish_reason, ca.stop_reason) == \
            (cb.token_ids, cb.text, cb.finish_reason, cb.stop_reason)
        if ca.logprobs is not None:
            assert len(cb.logprobs) == len(cb.token_ids)
            for la, lb in zip(ca.logprobs, cb.logprobs):
                assert list(la) == list(lb)
                np.testing.assert_allclose([x.logprob for x in la.values()], [x.logprob for x in lb.values()],
                                           rtol=1e-4, atol=1e-4)
            assert cb.cumulative_logprob == pytest.approx(ca.cumulative_logprob, rel=1e-4, abs=1e-4)
        if a.prompt_logprobs is not None:
            assert [list(p or {}) for p in a.prompt_logprobs] == [list(p or {}) for p in b.prompt_logprobs]
    check_idle(engines["on"])


def _speculated(llm: LLM, prompts, params) -> tuple[list[list[int]], int]:
    """The greedy outputs and how many proposals the engine verified meanwhile."""
    counts = llm.llm_engine.scheduler.spec_decode_counts
    before = counts.num_draft_tokens
    outputs = token_ids(llm, prompts, params)
    return outputs, counts.num_draft_tokens - before


def _bad_word(llm: LLM, output: list[int]) -> str:
    """Two output tokens as text that tokenizes back to them (so banning it changes that output)."""
    tokenizer = llm.llm_engine.tokenizer
    for i in range(4, len(output) - 1):
        text = tokenizer.decode(output[i:i + 2])
        if text.strip() == text and tokenizer.encode(text, add_special_tokens=False) == output[i:i + 2]:
            return text
    raise AssertionError("no output pair round-trips through the tokenizer")


@pytest.mark.parametrize("case", ["repetition", "presence", "frequency", "min_tokens", "bad_words"])
def test_requests_reading_their_outputs_are_speculated_exactly(engines, case):
    """Each verified position samples as if the proposals before it were outputs: penalties count them, min_tokens
    counts them, bad words match them. Proposals are verified, and greedy output is what it is without them.
    (Proposals come from the request's own tokens, so counting them moves repetition penalties never and presence
    rarely; `test_each_verified_row_reads_the_proposals_before_it` checks the rows themselves.)"""
    prompts = _repetitive_prompts(6, seed=8)
    base = dict(temperature=0.0, max_tokens=32, ignore_eos=True)
    plain = token_ids(engines["off"], prompts, SamplingParams(**base))
    # min_tokens: EOS made likely, so the count of outputs decides where each request stops
    options = {"repetition": dict(repetition_penalty=1.2), "presence": dict(presence_penalty=0.5),
               "frequency": dict(frequency_penalty=0.2),
               "min_tokens": dict(ignore_eos=False, min_tokens=12, logit_bias={EOS_ID: 8.0}),
               "bad_words": dict(bad_words=[_bad_word(engines["off"], plain[0])])}[case]
    params = SamplingParams(**{**base, **options})
    expected = token_ids(engines["off"], prompts, params)
    outputs, num_drafts = _speculated(engines["on"], prompts, params)
    assert outputs == expected
    assert num_drafts > 0, "the requests must verify proposals"
    assert expected != plain, "the option must change the output"
    if case == "min_tokens":
        assert all(len(o) == 13 and o[-1] == EOS_ID for o in outputs)
    check_idle(engines["on"])


def _text_prompts(llm: LLM, texts: list[str]) -> list[list[int]]:
    tokenizer = llm.llm_engine.tokenizer
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def _structured(**constraint) -> SamplingParams:
    from vllm_jax.sampling_params import StructuredOutputsParams

    return SamplingParams(temperature=0.0, max_tokens=56, structured_outputs=StructuredOutputsParams(**constraint))


REGEX = r"((ab|cd){1,3}-){2,5}x"
ITEMS = {"type": "array", "items": {"enum": ["ab", "cd", "efg"]}, "minItems": 2, "maxItems": 6}


@pytest.mark.parametrize("kind", ["json", "regex", "choice"])
def test_structured_outputs_are_speculated_position_by_position(engines, kind):
    """Prompts repeat text the constraint allows, so proposals survive the grammar and are verified, each
    position under the bitmask after the proposals before it: greedy output is identical to no speculation and
    valid."""
    import json
    import re

    if kind == "json":
        texts = ['["ab","cd","efg","ab","cd","efg","ab",', '["cd","cd","ab","cd","cd","ab",']
        params = _structured(json=ITEMS, disable_any_whitespace=True)
    elif kind == "regex":
        texts = ["abab-cdcd-abab-cdcd-abab-", "cd-cd-cd-ab-ab-ab-cd-"]
        params = _structured(regex=REGEX)
    else:
        texts = ["the cat sat on the mat. the cat sat on the mat. the", "the dog ran. the dog ran. the dog ran. the"]
        params = _structured(choice=["the cat sat on the mat", "the dog ran to the cat", "a dog"])
    prompts = _text_prompts(engines["on"], texts)
    expected = token_ids(engines["off"], prompts, params)
    outputs, num_drafts = _speculated(engines["on"], prompts, params)
    assert outputs == expected
    assert num_drafts > 0, "the constrained requests must verify proposals"
    tokenizer = engines["on"].llm_engine.tokenizer
    for output in outputs:
        text = tokenizer.decode(output, skip_special_tokens=True)
        if kind == "json":
            assert all(item in ITEMS["items"]["enum"] for item in json.loads(text))
        elif kind == "regex":
            assert re.fullmatch(REGEX, text), text
        else:
            assert text in params.structured_outputs.choice, text
    check_idle(engines["on"])


def test_sampled_structured_output_with_speculation_stays_valid(engines):
    """Sampled rows verify proposals by rejection sampling under each position's bitmask: rejected rows'
    residual samples and bonus tokens are masked too, so every output parses."""
    import json

    from vllm_jax.sampling_params import StructuredOutputsParams

    prompts = _text_prompts(engines["on"], ['["ab","cd","efg","ab","cd","efg","ab",'] * 6)
    params = [SamplingParams(temperature=0.7, seed=i, max_tokens=56, structured_outputs=StructuredOutputsParams(
        json=ITEMS, disable_any_whitespace=True)) for i in range(6)]
    outs = engines["on"].generate(prompts, params, use_tqdm=False)
    assert engines["on"].llm_engine.scheduler.spec_decode_counts.num_drafts > 0
    for out in outs:
        assert out.outputs[0].finish_reason == "stop"
        assert all(item in ITEMS["items"]["enum"] for item in json.loads(out.outputs[0].text))
    check_idle(engines["on"])


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(engines):
    on = engines["on"]
    prompts = _repetitive_prompts(6, seed=4)
    params = SamplingParams(temperature=0.8, seed=11, max_tokens=20, ignore_eos=True)
    alone = token_ids(on, [prompts[0]], params)[0]
    batched = token_ids(on, prompts, params)
    assert batched[0] == alone
    assert token_ids(on, prompts, params) == batched
    assert on.llm_engine.scheduler.spec_decode_counts.num_drafts > 0
    check_idle(on)


def test_sampled_output_matches_the_targets_distribution(checkpoint):
    """Exactness in distribution, end to end: requests restricted to 4 tokens (allowed_token_ids, so the full
    sampler variant verifies) continue a prompt made of those tokens, so proposals are plausible and often
    accepted. The empirical distributions of every output position with and without speculation agree
    (two-sample chi-square; the sampler-level tests show a biased rule would fail it)."""
    from scipy import stats as scipy_stats  # jax depends on scipy

    args = dict(ARGS, max_num_seqs=32, max_num_batched_tokens=128, num_gpu_blocks_override=400, min_token_bucket=128,
                min_seq_bucket=128)
    allowed = [11, 57, 130, 201]
    prompt = np.random.default_rng(6).choice(allowed, 40).tolist()
    llms = {"off": LLM(checkpoint, **args), "on": LLM(checkpoint, speculative_config=NGRAM, **args)}
    num = 1200
    seeds = {"off": 1000, "on": 50_000}  # independent samples: the same seeds would share their noise
    samples = {mode: np.array(token_ids(llm, [prompt] * num, [
        SamplingParams(temperature=1.0, allowed_token_ids=allowed, seed=seeds[mode] + i, max_tokens=4,
                       ignore_eos=True) for i in range(num)])) for mode, llm in llms.items()}
    counts = llms["on"].llm_engine.scheduler.spec_decode_counts
    assert counts.num_drafts >= num and counts.num_accepted_tokens > num // 4  # verified, often accepted
    assert counts.num_accepted_tokens < counts.num_draft_tokens
    for position in range(4):
        table = np.array([[np.sum(samples[mode][:, position] == t) for t in allowed] for mode in ("off", "on")])
        p_value = scipy_stats.chi2_contingency(table)[1]
        assert p_value > 1e-3, (position, table)


def test_batch_size_limit_switches_proposals_off(checkpoint):
    llm = LLM(checkpoint, speculative_config={**NGRAM, "disable_by_batch_size": 2}, **ARGS)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    token_ids(llm, _repetitive_prompts(6, seed=7), params)  # 6 running: no proposals while more than 2 run
    counts = llm.llm_engine.scheduler.spec_decode_counts
    crowded = counts.num_drafts
    token_ids(llm, _repetitive_prompts(1, seed=7), params)
    assert counts.num_drafts > crowded  # alone, it speculates
    assert crowded == 0


@pytest.mark.parametrize("config, message", [
    ({"method": "medusa", "num_speculative_tokens": 2}, "speculative_config.method"),
    ({"num_speculative_tokens": 2}, "speculative_config.method"),
    ({"method": "ngram"}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 40}, "max_num_batched_tokens"),  # 41 > 32 tokens
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, "unknown keys ['lookahead']"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "speculative_config.model"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "speculative_config.model"),
    ({"method": "eagle3", "num_speculative_tokens": 2, "model": "/nonexistent/head"}, "no such directory"),
    ('{"method": "ngram", ', "must be a JSON object"),
])
def test_bad_speculative_configs_are_refused_naming_the_key(checkpoint, config, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        EngineArgs(model=checkpoint, speculative_config=config, **ARGS).create_config()


def test_draft_model_without_weights_and_async_scheduling_are_refused(checkpoint, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="holds no weights"):
        EngineArgs(model=checkpoint, speculative_config={"method": "eagle3", "num_speculative_tokens": 2,
                                                         "model": str(tmp_path)}, **ARGS).create_config()
    with pytest.raises(ValueError, match="async_scheduling cannot be combined"):
        EngineArgs(model=checkpoint, speculative_config=NGRAM, async_scheduling=True, **ARGS).create_config()
    config = EngineArgs(model=checkpoint, speculative_config=NGRAM, **ARGS).create_config()
    assert not config.async_scheduling and config.speculative_config.num_speculative_tokens == 3
    default = {k: v for k, v in NGRAM.items() if k != "disable_by_batch_size"}
    for platform, limit in (("cpu", 4), ("gpu", None)):
        config = EngineArgs(model=checkpoint, speculative_config=default, **ARGS).create_config(platform)
        assert config.speculative_config.disable_by_batch_size == limit


# ---- the scheduler's side of constrained proposals (no model) ----------------------------------------------

def _grammar_scheduler():
    from tests.helpers.tiny_models import byte_tokenizer
    from vllm_jax.config import SchedulerConfig
    from vllm_jax.paged_kv.kv_cache_manager import KVCacheManager
    from vllm_jax.sampling_params import StructuredOutputsParams
    from vllm_jax.scheduler.request import Request
    from vllm_jax.scheduler.scheduler import Scheduler
    from vllm_jax.structured_output import GrammarCompiler, RequestGrammar
    from vllm_jax.utils import bitmask_width

    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=64, enable_chunked_prefill=True,
                             policy="fcfs", min_token_bucket=16, min_seq_bucket=8)
    scheduler = Scheduler(config, KVCacheManager(num_blocks=32, block_size=4, enable_caching=True, max_model_len=64),
                          4, num_spec_tokens=3)
    tokenizer = byte_tokenizer()
    compiler = GrammarCompiler(tokenizer, VOCAB_SIZE, [EOS_ID])
    grammar = RequestGrammar(compiler.new_matcher(compiler.compile(StructuredOutputsParams(choice=["yes", "no"]))),
                             bitmask_width(VOCAB_SIZE), compiler.stop_token_ids)
    request = Request(request_id="r", prompt_token_ids=[5, 6, 7], eos_token_id=EOS_ID, arrival_time=0.0, seed=0,
                      sampling_params=SamplingParams(max_tokens=10, ignore_eos=True), grammar=grammar)
    scheduler.add_request(request)
    return scheduler, request, tokenizer.encode("yes", add_special_tokens=False), EOS_ID


def _step(scheduler, sampled: list[int], drafts: list[int]):
    from vllm_jax.scheduler.output import ModelRunnerOutput

    out = scheduler.schedule()
    return out, scheduler.update_from_output(out, ModelRunnerOutput(
        req_ids=["r"], sampled_token_ids=[sampled], draft_token_ids={"r": drafts}))


def _allowed(row: np.ndarray) -> list[int]:
    return np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:VOCAB_SIZE]).tolist()


def test_a_proposal_the_grammar_forbids_is_dropped_with_those_after_it():
    scheduler, request, (y, e, s_), _ = _grammar_scheduler()
    _step(scheduler, [y], [e, 9, s_])  # prefill samples "y"; 9 is no letter of "yes"
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens == {"r": [e]} and out.num_scheduled_tokens == {"r": 2}
    rows = out.grammar_bitmask["r"]
    assert rows.shape[0] == 2 and _allowed(rows[0]) == [e] and _allowed(rows[1]) == [s_]  # row 1: after "e"
    np.testing.assert_array_equal(request.grammar.next_token_bitmask(), rows[0])  # the walk was rolled back


def test_grammar_rows_follow_the_proposals_and_a_stop_inside_the_run_ends_it():
    scheduler, request, (y, e, s_), eos = _grammar_scheduler()
    _step(scheduler, [y], [e, s_, eos])
    out, outputs = _step(scheduler, [e, s_, eos, 9], [])  # all three accepted, then a bonus token
    assert out.scheduled_spec_decode_tokens == {"r": [e, s_, eos]}
    rows = out.grammar_bitmask["r"]
    assert [_allowed(r) for r in rows] == [[e], [s_], [eos], [eos]]  # past the stop token: repeated, unused
    assert outputs[0].new_token_ids == [e, s_, eos] and outputs[0].finish_reason == "stop"  # 9 is dropped
    assert request.grammar.is_terminated and not scheduler.requests


def test_each_verified_row_reads_the_proposals_before_it():
    """Penalties' counts, min_tokens and bad words see outputs + proposals[:j] on row j; its RNG position and
    grammar row are its own."""
    from types import SimpleNamespace

    from vllm_jax.scheduler.output import SchedulerOutput
    from vllm_jax.worker.model_runner import ModelRunner
    from vllm_jax.worker.request_state import CachedRequestState

    params = SamplingParams(temperature=0.0, frequency_penalty=1.0, min_tokens=3, bad_words=["x"])
    params.bad_words_token_ids = [[11, 12]]
    params.all_stop_token_ids = {2}
    state = CachedRequestState("r", [5, 6, 10], 2, 2, params, seed=0, output_token_ids=[10])
    masks = np.arange(3 * 10, dtype=np.int32).reshape(3, 10)
    sched = SchedulerOutput([], [], {"r": 3}, 3, grammar_bitmask={"r": masks},
                            scheduled_spec_decode_tokens={"r": [11, 10]})
    runner = SimpleNamespace(vocab_size=VOCAB_SIZE)
    tensors, _ = ModelRunner._full_sampling_tensors(runner, sched, [state], [3], 4, np.array([2]))
    assert tensors.output_counts[:3, 10].tolist() == [1, 1, 2] and tensors.output_counts[:3, 11].tolist() == [0, 1, 1]
    assert tensors.positions[:3].tolist() == [3, 4, 5]
    np.testing.assert_array_equal(tensors.token_bitmask[:3], masks)
    assert np.isneginf(tensors.logit_bias[:3, 2]).tolist() == [True, True, False]  # min_tokens: 1, 2, then 3 outputs
    assert np.isneginf(tensors.logit_bias[:3, 12]).tolist() == [False, True, False]  # "11 12": after proposal 11

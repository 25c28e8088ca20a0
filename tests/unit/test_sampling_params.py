"""SamplingParams validation and normalization (vLLM's rules)."""

import dataclasses
import math

import pytest

from vllm_jax.sampling_params import RequestOutputKind, SamplingParams

BAD_VALUES = [
    ("n", dict(n=0)),
    ("n", dict(n=1.5)),
    ("presence_penalty", dict(presence_penalty=2.5)),
    ("presence_penalty", dict(presence_penalty=math.nan)),
    ("frequency_penalty", dict(frequency_penalty=-2.1)),
    ("repetition_penalty", dict(repetition_penalty=0.0)),
    ("repetition_penalty", dict(repetition_penalty=math.inf)),
    ("temperature", dict(temperature=-0.1)),
    ("temperature", dict(temperature=math.nan)),
    ("temperature", dict(temperature=math.inf)),
    ("temperature", dict(temperature="hot")),
    ("top_p", dict(top_p=0.0)),
    ("top_p", dict(top_p=1.1)),
    ("top_p", dict(top_p=math.nan)),
    ("top_k", dict(top_k=-2)),
    ("top_k", dict(top_k=2.5)),
    ("min_p", dict(min_p=-0.1)),
    ("min_p", dict(min_p=1.5)),
    ("max_tokens", dict(max_tokens=0)),
    ("min_tokens", dict(min_tokens=-1)),
    ("min_tokens", dict(min_tokens=5, max_tokens=3)),
    ("logprobs", dict(logprobs=-2)),
    ("logprobs", dict(logprobs=-1)),
    ("prompt_logprobs", dict(prompt_logprobs=-3)),
    ("seed", dict(seed="42")),
    ("seed", dict(seed=1.5)),
    ("stop", dict(stop=[""])),
    ("stop", dict(stop=[1])),
    ("stop", dict(stop="x", detokenize=False)),
    ("stop_token_ids", dict(stop_token_ids=[-1])),
    ("stop_token_ids", dict(stop_token_ids=["a"])),
    ("logit_bias", dict(logit_bias={"x": 1.0})),
    ("logit_bias", dict(logit_bias={1: math.nan})),
    ("logit_bias", dict(logit_bias={-5: 1.0})),
    ("allowed_token_ids", dict(allowed_token_ids=[])),
    ("allowed_token_ids", dict(allowed_token_ids=[-1])),
    ("bad_words", dict(bad_words="oops")),
    ("bad_words", dict(bad_words=[" "])),
    ("output_kind", dict(output_kind=7)),
]


@pytest.mark.parametrize("field_name,kwargs", BAD_VALUES, ids=[f"{f}-{kw}" for f, kw in BAD_VALUES])
def test_each_bad_field_raises_value_error_naming_the_field(field_name, kwargs):
    with pytest.raises(ValueError, match=field_name):
        SamplingParams(**kwargs)


def test_defaults_are_valid_and_unchanged():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens) == (1, 1.0, 1.0, 0, 0.0, 16)
    assert p.stop == [] and p.stop_token_ids == [] and p.bad_words == [] and p.seed is None


def test_greedy_resets_top_p_top_k_min_p_but_sampling_keeps_them():
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=5, min_p=0.2)
    assert (greedy.top_p, greedy.top_k, greedy.min_p) == (1.0, 0, 0.0) and greedy.is_greedy
    sampled = SamplingParams(temperature=0.7, top_p=0.5, top_k=5, min_p=0.2)
    assert (sampled.top_p, sampled.top_k, sampled.min_p) == (0.5, 5, 0.2) and not sampled.is_greedy


def test_tiny_positive_temperature_is_raised_to_vllm_minimum():
    assert SamplingParams(temperature=1e-3).temperature == pytest.approx(1e-2)


def test_stop_string_becomes_list():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


def test_vllm_spellings_are_normalized():
    p = SamplingParams(top_k=-1, seed=-1, logprobs=True, output_kind=1)
    assert p.top_k == 0 and p.seed is None and p.logprobs == 1 and p.output_kind is RequestOutputKind.DELTA


def test_logit_bias_keys_become_ints_and_values_are_clamped():
    p = SamplingParams(logit_bias={"7": 250.0, 3: -1000, 4: 2.5})
    assert p.logit_bias == {7: 100.0, 3: -100.0, 4: 2.5}


def test_stop_token_ids_join_all_stop_token_ids():
    p = SamplingParams(stop_token_ids=[5, 9])
    assert {5, 9} <= p.all_stop_token_ids


@pytest.mark.parametrize("field_name,kwargs", [
    ("stop_token_ids", dict(stop_token_ids=[100])),
    ("allowed_token_ids", dict(allowed_token_ids=[1, 100])),
    ("logit_bias", dict(logit_bias={100: 1.0})),
])
def test_verify_token_ids_rejects_ids_outside_vocab(field_name, kwargs):
    p = SamplingParams(**kwargs)
    p.verify_token_ids(101)  # in range for a bigger vocab
    with pytest.raises(ValueError, match=field_name):
        p.verify_token_ids(100)


def test_verify_token_ids_checks_tokenized_bad_words():
    p = SamplingParams(bad_words=["x"])
    p.bad_words_token_ids = [[3, 120]]
    with pytest.raises(ValueError, match="bad_words"):
        p.verify_token_ids(100)


def test_clone_is_deep():
    p = SamplingParams(stop=["a"], logit_bias={1: 1.0}, allowed_token_ids=[1, 2])
    c = p.clone()
    c.stop.append("b")
    c.logit_bias[2] = 3.0
    c.allowed_token_ids.append(9)
    c.all_stop_token_ids.add(77)
    assert p.stop == ["a"] and p.logit_bias == {1: 1.0} and p.allowed_token_ids == [1, 2]
    assert 77 not in p.all_stop_token_ids


def test_dataclasses_replace_revalidates():
    with pytest.raises(ValueError, match="top_p"):
        dataclasses.replace(SamplingParams(), top_p=2.0)

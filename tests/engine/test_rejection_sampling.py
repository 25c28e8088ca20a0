"""The sampler's verification of proposals (speculative decoding): greedy rows accept exactly the argmax, sampled
rows produce exactly the target distribution (chi-square against p, and the same test rejects a biased rule),
filtered distributions (top-k) included, and the acceptance rate is p(x)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from scipy import stats as scipy_stats

from vllm_jax.sample.sampler import SamplingTensors, sample

VOCAB = 6
NUM_ROWS = 20_000


def _tensors(num_rows: int, temperature: float, draft: np.ndarray, top_k: int = 0) -> SamplingTensors:
    return SamplingTensors(
        temperature=np.full(num_rows, temperature, np.float32), top_p=np.ones(num_rows, np.float32),
        top_k=np.full(num_rows, top_k, np.int32), min_p=np.zeros(num_rows, np.float32),
        seeds=np.arange(num_rows, dtype=np.uint32), positions=np.full(num_rows, 7, np.int32),
        draft_token_ids=draft.astype(np.int32))


def _target(logits_row: np.ndarray, top_k: int = 0) -> np.ndarray:
    p = np.exp(logits_row.astype(np.float64) - logits_row.max())
    if top_k:
        p[np.argsort(-logits_row)[top_k:]] = 0.0
    return p / p.sum()


def _gof_p_value(tokens: np.ndarray, p: np.ndarray) -> float:
    """Chi-square goodness of fit of `tokens` to `p`, over the tokens p can produce (any other is a failure)."""
    support = p > 0
    assert np.all(support[tokens]), "a token outside the target's support was produced"
    observed = np.bincount(tokens, minlength=len(p))[support]
    expected = p[support] / p[support].sum() * observed.sum()
    return float(scipy_stats.chisquare(observed, expected).pvalue)


LOGITS = np.array([1.2, 0.3, -0.5, 2.0, 0.9, -1.5], np.float32)


def test_sampled_rows_with_a_proposal_follow_the_target_distribution():
    draft = 4  # p(4) is about 0.2: both outcomes are frequent
    logits = jnp.asarray(np.tile(LOGITS, (NUM_ROWS, 1)))
    out = sample(logits, _tensors(NUM_ROWS, 1.0, np.full(NUM_ROWS, draft)))
    tokens, accepted = np.asarray(out.token_ids), np.asarray(out.accepted)
    p = _target(LOGITS)
    assert _gof_p_value(tokens, p) > 1e-3
    assert np.all(tokens[accepted] == draft)
    # accepted with probability p(x): a binomial test
    assert scipy_stats.binomtest(int(accepted.sum()), NUM_ROWS, float(p[draft])).pvalue > 1e-3
    # A rejected row never yields the proposal (the residual excludes it).
    assert not np.any(tokens[~accepted] == draft)


def test_the_same_test_rejects_a_biased_rule():
    """Power: resampling rejected rows from p itself (forgetting to remove the proposal) over-produces it, and the
    goodness-of-fit test above catches that at this sample size."""
    draft = 4
    logits = jnp.asarray(np.tile(LOGITS, (NUM_ROWS, 1)))
    out = sample(logits, _tensors(NUM_ROWS, 1.0, np.full(NUM_ROWS, draft)))
    plain = sample(logits, _tensors(NUM_ROWS, 1.0, np.full(NUM_ROWS, -1)))  # no proposal: a sample from p
    accepted = np.asarray(out.accepted)
    biased = np.where(accepted, draft, np.asarray(plain.token_ids))
    assert _gof_p_value(biased, _target(LOGITS)) < 1e-6


def test_top_k_filtered_rows_and_proposals_outside_the_support():
    """The target is the filtered distribution: a proposal top-k removed is never accepted, one inside is accepted
    with its renormalized probability."""
    logits = jnp.asarray(np.tile(LOGITS, (NUM_ROWS, 1)))
    p = _target(LOGITS, top_k=3)
    outside = sample(logits, _tensors(NUM_ROWS, 1.0, np.full(NUM_ROWS, 5), top_k=3))
    assert not np.asarray(outside.accepted).any()
    assert _gof_p_value(np.asarray(outside.token_ids), p) > 1e-3
    inside = sample(logits, _tensors(NUM_ROWS, 1.0, np.full(NUM_ROWS, 0), top_k=3))
    assert _gof_p_value(np.asarray(inside.token_ids), p) > 1e-3
    accepted = int(np.asarray(inside.accepted).sum())
    assert scipy_stats.binomtest(accepted, NUM_ROWS, float(p[0])).pvalue > 1e-3


def test_greedy_rows_accept_exactly_the_argmax_and_rows_without_proposals_sample_as_usual():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(8, VOCAB)).astype(np.float32)
    argmax = logits.argmax(axis=1)
    draft = np.where(np.arange(8) % 2 == 0, argmax, (argmax + 1) % VOCAB)
    draft[6:] = -1  # bonus rows: no proposal
    temperature = np.zeros(8, np.float32)
    temperature[7] = 1.0  # one sampled row without a proposal, in the same call
    tensors = _tensors(8, 0.0, draft)
    tensors = SamplingTensors(**{**tensors.__dict__, "temperature": temperature})
    out = sample(jnp.asarray(logits), tensors)
    accepted = np.asarray(out.accepted)
    np.testing.assert_array_equal(accepted[:6], np.arange(6) % 2 == 0)
    assert not accepted[6:].any()
    np.testing.assert_array_equal(np.asarray(out.token_ids)[:7], argmax[:7])
    plain = sample(jnp.asarray(logits), SamplingTensors(**{**tensors.__dict__, "draft_token_ids": None}))
    assert int(out.token_ids[7]) == int(plain.token_ids[7])  # same (seed, position) noise, no proposal

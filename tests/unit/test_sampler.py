"""Device sampler + host builder: distributions, filters, masks, penalties, logprobs, counter-based RNG."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vllm_jax.sample.metadata import NO_LOGPROBS, RowSamplingInput, build_sampling_tensors, seed_to_uint32
from vllm_jax.sample.sampler import (
    SamplingTensors,
    _candidate_threshold,
    apply_logits_processors,
    apply_top_k_top_p,
    compute_logprobs,
    row_argmax,
    sample,
    top_k_lane_wide,
)
from vllm_jax.sampling_params import SamplingParams

SAMPLE = jax.jit(sample, static_argnames="num_logprobs")
V = 32  # every device call uses [ROWS, V] so the whole file compiles only a handful of programs
ROWS = 64


def _tensors(params, *, seeds=None, positions=None, prompts=None, outputs=None):
    rows = [RowSamplingInput(p, seeds[i] if seeds else i, prompts[i] if prompts else [],
                             outputs[i] if outputs else [], positions[i] if positions else 0)
            for i, p in enumerate(params)]
    return build_sampling_tensors(rows, ROWS, V)


def _pad(logits):
    return jnp.asarray(np.pad(logits, ((0, ROWS - len(logits)), (0, 0))), jnp.float32)


def _draw(logits, params, *, seeds=None, positions=None, **kw):
    """Sampled ids for any number of rows, in chunks of ROWS (padding rows are greedy and ignored)."""
    tokens = []
    for start in range(0, len(params), ROWS):
        chunk = slice(start, start + ROWS)
        t, _ = _tensors(params[chunk], seeds=seeds[chunk] if seeds else list(range(start, start + ROWS)),
                           positions=positions[chunk] if positions else None,
                           **{name: rows[chunk] for name, rows in kw.items()})
        n = len(params[chunk])
        tokens.append(np.asarray(SAMPLE(_pad(logits[chunk]), t).token_ids)[:n])
    return np.concatenate(tokens)


def _random_logits(rows, seed=0, scale=2.0):
    return np.random.default_rng(seed).normal(0.0, scale, (rows, V)).astype(np.float32)


def test_greedy_rows_take_argmax_of_logits():
    logits = _random_logits(8)
    assert np.array_equal(_draw(logits, [SamplingParams(temperature=0.0)] * 8), logits.argmax(-1))


@pytest.mark.parametrize("chunk", [4, 8, 16])
def test_row_argmax_equals_argmax_with_ties_padding_inf_and_nan(chunk):
    rng = np.random.default_rng(chunk)
    x = rng.integers(-3, 4, (12, 37)).astype(np.float32)  # small integers: many ties, across chunks too
    x[1] = -np.inf  # a fully masked row
    x[2, 30:] = 9.0  # the max only in the padded last chunk
    x[3, [5, 20]] = np.nan  # NaN counts as the largest, the first one wins
    x[4, :] = 1.0  # all tied: index 0
    got = np.asarray(jax.jit(row_argmax, static_argnums=1)(jnp.asarray(x), chunk))
    np.testing.assert_array_equal(got, np.asarray(jnp.argmax(jnp.asarray(x), axis=-1)))
    assert got.dtype == np.int32 and got[3] == 5 and got[2] == 30


def test_temperature_sampling_matches_softmax_distribution():
    base = np.full(V, -np.inf, np.float32)
    base[:6] = [1.0, 0.5, 0.0, -0.5, -1.0, 2.0]
    n, temperature = 4000, 0.7
    tokens = _draw(np.tile(base, (n, 1)), [SamplingParams(temperature=temperature)] * n,
                   seeds=list(range(n)), positions=[i % 13 for i in range(n)])
    assert tokens.max() < 6
    expected = n * np.asarray(jax.nn.softmax(base[:6] / temperature))
    chi2 = float(np.sum((np.bincount(tokens, minlength=6) - expected) ** 2 / expected))
    assert chi2 < 20.5  # 5 degrees of freedom, p = 0.001


def test_top_k_one_and_tiny_top_p_equal_greedy():
    logits = _random_logits(64, seed=1)
    assert np.array_equal(_draw(logits, [SamplingParams(temperature=1.0, top_k=1)] * 64), logits.argmax(-1))
    assert np.array_equal(_draw(logits, [SamplingParams(temperature=1.0, top_p=1e-6)] * 64), logits.argmax(-1))


def _reference_keep(row, temperature, top_k, top_p, min_p):
    """numpy: which tokens may be sampled after temperature, min_p, top-k, top-p (vLLM semantics, ties kept)."""
    x = row.astype(np.float64) / temperature
    probs = np.exp(x - x.max())
    x = np.where(probs / probs.max() < min_p, -np.inf, x)
    s = np.sort(x)[::-1]
    keep = np.isfinite(s)
    if top_k > 0:
        keep[top_k:] = False
    if top_p < 1.0:
        p = np.where(keep, np.exp(s - s[0]), 0.0)
        p /= p.sum()
        keep &= (np.cumsum(p) - p) < top_p
    return x >= s[keep].min()


def test_top_k_top_p_min_p_never_sample_a_masked_token():
    rng = np.random.default_rng(2)
    num_cases, draws = 24, 40
    logits = _random_logits(num_cases, seed=3, scale=3.0)
    cases = [SamplingParams(temperature=float(rng.choice([0.5, 1.0, 2.0])), top_k=int(rng.choice([0, 1, 3, 10])),
                            top_p=float(rng.choice([1.0, 0.3, 0.8])), min_p=float(rng.choice([0.0, 0.05, 0.3])))
             for _ in range(num_cases)]
    tokens = _draw(np.repeat(logits, draws, 0), [c for c in cases for _ in range(draws)],
                   seeds=list(range(num_cases * draws))).reshape(num_cases, draws)
    for i, c in enumerate(cases):
        keep = _reference_keep(logits[i], c.temperature, c.top_k, c.top_p, c.min_p)
        assert keep[tokens[i]].all(), (c, tokens[i], np.flatnonzero(keep))
    assert max(len(set(r)) for r in tokens.tolist()) > 3  # really sampling, not collapsing to greedy


@jax.jit
def _masks_by_candidate_count(x, k, p):
    """The top-k/top-p mask found among 1, 3, 8 and V candidates, and whether 8 candidates sufficed for all rows."""
    masks = [apply_top_k_top_p(x, k, p, num_candidates=c) for c in (1, 3, 8, V)]
    exact = _candidate_threshold(jax.lax.top_k(x, 8)[0], jax.nn.logsumexp(x, axis=-1), k, p)[1]
    return masks, jnp.all(exact | ((k == 0) & (p >= 1)))


@pytest.mark.parametrize("scale,ks,ps", [(1.5, [0, 1, 2, 5, 20, 32, 100], [1.0, 0.05, 0.5, 0.9, 0.99]),
                                         (6.0, [0, 1, 2, 5], [1.0, 0.05, 0.5])])
def test_top_k_top_p_mask_matches_sort_reference_whether_cutoff_is_in_candidates_or_bisected(scale, ks, ps):
    rng = np.random.default_rng(4)
    logits = _random_logits(ROWS, seed=5, scale=scale)
    logits[0, :10] = logits[0, 0]  # ties across the cutoff
    top_k, top_p = rng.choice(ks, ROWS).astype(np.int32), rng.choice(ps, ROWS).astype(np.float32)
    top_k[0], top_p[0] = 4, 1.0
    masks, eight_suffice = _masks_by_candidate_count(jnp.asarray(logits), jnp.asarray(top_k), jnp.asarray(top_p))
    assert bool(eight_suffice) == (scale > 2)  # the peaked batch exercises the candidate path below V, too
    for count, out in zip((1, 3, 8, V), masks):
        for i in range(ROWS):
            keep = _reference_keep(logits[i], 1.0, int(top_k[i]), float(top_p[i]), 0.0)
            assert np.array_equal(np.isfinite(np.asarray(out[i])), keep), (count, i, top_k[i], top_p[i])


def test_logit_bias_forces_a_token():
    logits = _random_logits(16, seed=6)
    assert (_draw(logits, [SamplingParams(temperature=1.0, logit_bias={7: 100.0})] * 16) == 7).all()


def test_allowed_token_ids_restrict_sampling():
    tokens = _draw(_random_logits(64, seed=7), [SamplingParams(temperature=2.0, allowed_token_ids=[2, 5, 11])] * 64)
    assert set(tokens.tolist()) == {2, 5, 11}


def _with_bad_words(words, **kw):
    p = SamplingParams(bad_words=["w"] * len(words), **kw)
    p.bad_words_token_ids = words
    return p


def test_single_token_bad_word_is_never_sampled():
    logits = _random_logits(4, seed=8)
    logits[:, 9] = 50.0
    assert not (_draw(logits, [_with_bad_words([[9]], temperature=0.0)] * 4) == 9).any()


def test_multi_token_bad_word_banned_only_after_its_prefix():
    logits = np.zeros((3, V), np.float32)
    logits[:, 9] = 50.0
    p = _with_bad_words([[4, 5, 9]], temperature=0.0)
    tokens = _draw(logits, [p] * 3, outputs=[[1, 4, 5], [4, 6], [5]])
    assert tokens[0] != 9 and tokens[1] == 9 and tokens[2] == 9


def test_min_tokens_masks_stop_ids_until_reached():
    logits = np.zeros((3, V), np.float32)
    logits[:, 2] = 50.0  # EOS
    logits[:, 3] = 40.0  # a user stop id
    p = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[3])
    p.all_stop_token_ids.add(2)
    tokens = _draw(logits, [p] * 3, outputs=[[], [7], [7, 7]])
    assert tokens[0] not in (2, 3) and tokens[1] not in (2, 3) and tokens[2] == 2


def test_penalties_match_numpy_reference():
    logits = _random_logits(3, seed=9)
    prompts, outputs = [[1, 2, 2, 3], [4], [1, 2]], [[3, 3, 5, 7], [4, 4, 4, 6], [5]]
    params = [SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.7),
              SamplingParams(repetition_penalty=0.8, frequency_penalty=-0.4), SamplingParams()]
    t, _ = _tensors(params, prompts=prompts, outputs=outputs)
    got = np.asarray(jax.jit(apply_logits_processors)(_pad(logits), t))
    for i, p in enumerate(params):
        ref = logits[i].astype(np.float64)
        counts = np.bincount(outputs[i], minlength=V)
        seen = np.isin(np.arange(V), prompts[i] + outputs[i])
        ref = np.where(seen & (ref > 0), ref / p.repetition_penalty, np.where(seen, ref * p.repetition_penalty, ref))
        ref = ref - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
        np.testing.assert_allclose(got[i], ref, rtol=1e-6, atol=1e-6)
    assert t.is_full


def test_logprobs_are_raw_log_softmax_with_ranks():
    logits = _random_logits(4, seed=10)
    params = [SamplingParams(temperature=0.5, repetition_penalty=1.5, logprobs=3)] * 4
    t, k = _tensors(params, prompts=[[1, 2]] * 4)
    out = SAMPLE(_pad(logits), t, num_logprobs=k)
    ids, lps, ranks = (np.asarray(a)[:4] for a in (out.logprob_token_ids, out.logprobs, out.ranks))
    raw = np.asarray(jax.nn.log_softmax(jnp.asarray(logits)))
    assert ids.shape == (4, 4) and np.array_equal(ids[:, 0], np.asarray(out.token_ids)[:4])
    np.testing.assert_allclose(lps, np.take_along_axis(raw, ids, -1), rtol=1e-6)
    assert np.array_equal(ids[:, 1:], np.argsort(-logits, -1, kind="stable")[:, :3])
    expected_ranks = 1 + (logits[:, None, :] > np.take_along_axis(logits, ids, -1)[:, :, None]).sum(-1)
    assert np.array_equal(ranks, expected_ranks)


def test_tied_tokens_share_a_rank_wherever_they_appear_and_k_is_clamped_to_vocab():
    logits = jnp.array([[0.0, 3.0, 3.0, 1.0, 3.0]], jnp.float32)
    ids, _, ranks = jax.jit(compute_logprobs, static_argnums=2)(logits, jnp.array([4]), 20)
    assert ids.tolist() == [[4, 1, 2, 4, 3, 0]] and ranks.tolist() == [[1, 1, 1, 1, 4, 5]]


@pytest.mark.parametrize("vocab", [100, 300])
def test_lane_wide_top_k_equals_top_k_ties_included(vocab):
    """TPU's top-K logprobs come from a 128-wide top-k (a layout XLA:TPU compiles fast) cut to K: the same ids,
    values and tie order as jax.lax.top_k(K), for K below, at and beyond a lane, up to the vocab."""
    rng = np.random.default_rng(vocab)
    logits = jnp.asarray(rng.integers(0, 6, size=(3, vocab)).astype(np.float32))  # many ties
    for k in sorted({1, 20, min(128, vocab), min(129, vocab), vocab}):
        values, ids = jax.jit(top_k_lane_wide, static_argnums=1)(logits, k)
        want_values, want_ids = jax.lax.top_k(logits, k)
        assert np.array_equal(ids, want_ids) and np.array_equal(values, want_values), k


def test_logprobs_zero_gives_sampled_token_only_and_none_gives_nothing():
    logits = _pad(_random_logits(2, seed=11))
    t, k = _tensors([SamplingParams(logprobs=0), SamplingParams()])
    assert k == 0 and SAMPLE(logits, t, num_logprobs=k).logprobs.shape == (ROWS, 1)
    t, k = _tensors([SamplingParams()] * 2)
    assert k == NO_LOGPROBS and SAMPLE(logits, t, num_logprobs=k).logprobs is None


def test_seeded_row_samples_same_token_in_any_batch_slot():
    logits = _random_logits(1, seed=12, scale=0.1)
    target = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)
    for seed in range(5):
        alone = _draw(logits, [target], seeds=[seed], positions=[17])[0]
        others = [SamplingParams(temperature=float(i % 3), top_k=i, presence_penalty=0.5) for i in range(8)]
        others[5] = target
        batch_logits = _random_logits(8, seed=13)
        batch_logits[5] = logits[0]
        in_batch = _draw(batch_logits, others, seeds=[99 + i if i != 5 else seed for i in range(8)],
                         positions=[17 if i == 5 else i for i in range(8)])
        assert in_batch[5] == alone


def test_noise_depends_on_seed_and_position():
    flat = np.zeros((ROWS, V), np.float32)  # the token is the argmax of the noise alone
    by_position = _draw(flat, [SamplingParams()] * ROWS, seeds=[7] * ROWS, positions=list(range(ROWS)))
    assert len(set(by_position.tolist())) > 10
    same_position = _draw(flat, [SamplingParams()] * ROWS, seeds=[7] * ROWS, positions=[3] * ROWS)
    assert len(set(same_position.tolist())) == 1
    by_seed = _draw(flat, [SamplingParams()] * ROWS, seeds=list(range(ROWS)), positions=[3] * ROWS)
    assert len(set(by_seed.tolist())) > 10


def test_padding_rows_and_fully_masked_rows_stay_finite():
    p = _with_bad_words([[3]], temperature=1.0, allowed_token_ids=[3], logprobs=3)  # every token banned
    t, k = _tensors([p, SamplingParams(temperature=0.8, top_p=0.5)])
    out = SAMPLE(_pad(_random_logits(2, seed=14)), t, num_logprobs=k)
    tokens = np.asarray(out.token_ids)
    assert ((tokens >= 0) & (tokens < V)).all() and np.isfinite(np.asarray(out.logprobs)).all()


def test_basic_builder_skips_vocab_arrays_until_one_row_needs_them_and_fills_only_that_row():
    rows = [RowSamplingInput(SamplingParams(temperature=0.8, top_p=0.9, seed=i), i, list(range(50)), [1, 2, 3], 53)
            for i in range(256)]
    t, k = build_sampling_tensors(rows, 256, 150_000)
    assert not t.is_full and t.logit_bias is None and t.output_counts is None and k == NO_LOGPROBS
    assert isinstance(t, SamplingTensors) and t.temperature.shape == (256,) and t.seeds.dtype == np.uint32
    rows[7] = RowSamplingInput(SamplingParams(frequency_penalty=0.5), 7, [4, 4], [9, 9, 5], 5)
    full, _ = build_sampling_tensors(rows, 256, 150_000)
    assert full.is_full and full.output_counts.shape == (256, 150_000)
    assert np.flatnonzero(full.output_counts.any(-1)).tolist() == [7] and full.output_counts[7, 9] == 2
    assert np.flatnonzero(full.frequency_penalties).tolist() == [7] and not full.prompt_mask.any()
    np.testing.assert_array_equal(full.temperature, np.r_[[0.8] * 7, 1.0, [0.8] * 248].astype(np.float32))


def test_seed_to_uint32_keeps_32_bit_seeds_and_every_higher_bit_moves_the_result():
    rng = np.random.default_rng(15)
    for seed in [0, 1, 42, 2**31, 2**32 - 1, *rng.integers(0, 2**32, 100).tolist()]:
        assert seed_to_uint32(seed) == seed  # a user's 32-bit seed is used as given
        for bit in range(32, 64):  # seeds that differ only above bit 31 must not collide
            assert seed_to_uint32(seed | 1 << bit) != seed_to_uint32(seed), (seed, bit)
    for seed in (-3, -(2**40), 2**63 + 5):  # Python ints wrap like uint64, as numpy's seeds would
        folded = seed_to_uint32(seed)
        assert 0 <= folded < 2**32 and folded == seed_to_uint32(seed % 2**64)
    assert seed_to_uint32(-1) == 0  # 2**64 - 1: both halves all ones, folded away


def test_top_k_beyond_the_vocab_or_int32_means_no_top_k():
    rows = [RowSamplingInput(SamplingParams(top_k=k), 0, [1], [], 1) for k in (5, 320, 2**40)]
    tensors, _ = build_sampling_tensors(rows, 4, 320)
    assert tensors.top_k.tolist() == [5, 0, 0, 0]

"""The device-side sampler: batched, float32, pure functions that trace once per (S, V, variant, K).

Order follows vLLM v1: the structured-output bitmask first (masked tokens get -inf, and logprobs see that, as in
vLLM where the runner masks the logits before the sampler); logprobs from those raw logits; logit_bias (which
already carries the -inf masks for
allowed_token_ids, bad words and min_tokens stop ids); repetition -> frequency -> presence penalties; greedy rows
take the argmax; other rows divide by temperature, apply min_p, then top-k and top-p, then Gumbel-max.

Randomness is counter-based: a row's noise is drawn from `fold_in(key(seed), position)`, so a seeded request
samples the same token whatever batch it shares, wherever in the batch it sits and however it was chunked.

Jitting: `num_logprobs` is static: the device step always passes the engine's max_logprobs and says per step,
with the traced `logprobs_on`, whether any row wants them, so one program serves steps with and without logprobs
(the logprobs branch runs only when asked). The full variant's [S, V] inputs (bias, penalties, bitmask) are
consumed by `process_logits`, a small elementwise program of its own; `sample_processed`, the program holding
the argmax, top-k / top-p, the noise and the logprobs, then takes the basic fields only, so both variants share
it: one sampling program per sequence bucket (docs/architecture/08-sampling.md, "Sampling").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

GREEDY_TEMPERATURE = 1e-5  # rows below this are greedy (matches SamplingParams.is_greedy)
TOP_CANDIDATES = 256  # top-k/top-p seek their cutoff among this many largest logits before bisecting the row
LANES = 128  # a TPU vector register's lane count
ARGMAX_CHUNK = LANES  # row_argmax's chunk width (a lane multiple on TPU)



@dataclasses.dataclass(frozen=True)
class SamplingTensors:
    """Per-row sampling parameters, S rows (padding rows: temperature 0 and neutral values).

    The full part is None in the basic variant; in the full variant every full field is set.
    """

    temperature: Any  # [S] f32; < GREEDY_TEMPERATURE means greedy
    top_p: Any  # [S] f32; 1.0 = off
    top_k: Any  # [S] int32; 0 = off
    min_p: Any  # [S] f32; 0.0 = off
    seeds: Any  # [S] uint32
    positions: Any  # [S] int32; position of the token being sampled (the RNG counter)
    logit_bias: Any = None  # [S, V] f32, additive, -inf for banned tokens
    prompt_mask: Any = None  # [S, V] bool, token occurs in the prompt
    output_counts: Any = None  # [S, V] int32, occurrences in the output so far
    presence_penalties: Any = None  # [S] f32
    frequency_penalties: Any = None  # [S] f32
    repetition_penalties: Any = None  # [S] f32
    token_bitmask: Any = None  # [S, ceil(V / 32)] int32: bit t % 32 of word t // 32 allows token t; -1 = free row
    # Speculative decoding (set on every step of an engine that speculates): [S] int32, the proposed token this
    # row verifies, -1 where there is none (see verify_proposals)
    draft_token_ids: Any = None

    @property
    def is_full(self) -> bool:
        return self.logit_bias is not None


jax.tree_util.register_dataclass(
    SamplingTensors,
    data_fields=[f.name for f in dataclasses.fields(SamplingTensors)],
    meta_fields=[],
)


@dataclasses.dataclass(frozen=True)
class SamplerOutput:
    """Sampled ids, plus (when asked) the sampled token's and the top-K tokens' raw logprobs and ranks."""

    token_ids: Any  # [S] int32
    logprob_token_ids: Any = None  # [S, 1+K] int32: sampled token first, then the top-K ids
    logprobs: Any = None  # [S, 1+K] f32
    ranks: Any = None  # [S, 1+K] int32, 1-based
    accepted: Any = None  # [S] bool, speculative decoding: the row's proposal was accepted (token_ids holds it)


jax.tree_util.register_dataclass(
    SamplerOutput,
    data_fields=[f.name for f in dataclasses.fields(SamplerOutput)],
    meta_fields=[],
)


def sample(logits: jax.Array, t: SamplingTensors, num_logprobs: int | None = None,
           logprobs_on: jax.Array | None = None) -> SamplerOutput:
    """Sample one token per row of `logits` [S, V]: the full variant's logits processors (`process_logits`),
    then `sample_processed`.

    `num_logprobs` (static) is K: None or negative -> no logprobs; 0 -> the sampled token's logprob and rank
    only ([S, 1]); K > 0 -> [S, 1+K]. K is clamped to V. `logprobs_on` (a traced bool scalar, optional): when
    false the logprobs are not computed and their arrays hold zeros, so the caller reads them only when true.
    """
    if t.is_full:
        masked, processed = process_logits(logits, t)
    else:
        masked = processed = logits.astype(jnp.float32)
    return sample_processed(masked, processed, basic_tensors(t), num_logprobs, logprobs_on)


def process_logits(logits: jax.Array, t: SamplingTensors) -> tuple[jax.Array, jax.Array]:
    """The full variant's [S, V] part: -> (the logits with the structured-output bitmask applied, what the
    logprobs see; those logits after logit_bias and the penalties, what the sampling sees). Elementwise only, so
    it is cheap to compile: a device step runs it as its own program before the one sampling program of the
    sequence bucket (docs/architecture/08-sampling.md, "Sampling")."""
    masked = apply_token_bitmask(logits.astype(jnp.float32), t.token_bitmask)
    return masked, apply_logits_processors(masked, t)


def basic_tensors(t: SamplingTensors) -> SamplingTensors:
    """`t` without its full variant's fields: what `sample_processed` takes, whichever variant `t` is."""
    return SamplingTensors(temperature=t.temperature, top_p=t.top_p, top_k=t.top_k, min_p=t.min_p, seeds=t.seeds,
                           positions=t.positions, draft_token_ids=t.draft_token_ids)


def sample_processed(masked: jax.Array, processed: jax.Array, t: SamplingTensors, num_logprobs: int | None = None,
                     logprobs_on: jax.Array | None = None) -> SamplerOutput:
    """`sample` after the logits processors: the logprobs come from `masked`, the token from `processed` (the
    same array in the basic variant); `t` holds the basic fields only (`basic_tensors`)."""
    if t.is_full:
        raise ValueError("sample_processed takes basic_tensors(t): the processors already ran")
    masked = masked.astype(jnp.float32)
    processed = processed.astype(jnp.float32)
    greedy = t.temperature < GREEDY_TEMPERATURE
    greedy_ids = row_argmax(processed)
    accepted = None
    if t.draft_token_ids is None:
        random_ids = jax.lax.cond(
            jnp.all(greedy),
            lambda: greedy_ids,
            lambda: _random_sample(processed, t, greedy),
        )
        token_ids = jnp.where(greedy, greedy_ids, random_ids)
    else:
        token_ids, accepted = verify_proposals(processed, t, greedy, greedy_ids)
    if num_logprobs is None or num_logprobs < 0:
        return SamplerOutput(token_ids=token_ids, accepted=accepted)
    if logprobs_on is None:
        ids, lps, ranks = compute_logprobs(masked, token_ids, num_logprobs)
    else:
        ids, lps, ranks = jax.lax.cond(logprobs_on, lambda: compute_logprobs(masked, token_ids, num_logprobs),
                                       lambda: _no_logprobs(token_ids.shape[0], masked.shape[-1], num_logprobs))
    return SamplerOutput(token_ids=token_ids, logprob_token_ids=ids, logprobs=lps, ranks=ranks, accepted=accepted)


def _no_logprobs(rows: int, vocab: int, num_logprobs: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """compute_logprobs' shapes filled with zeros: the branch a step without logprobs takes."""
    width = 1 + min(max(int(num_logprobs), 0), vocab)
    return (jnp.zeros((rows, width), jnp.int32), jnp.zeros((rows, width), jnp.float32),
            jnp.zeros((rows, width), jnp.int32))


def verify_proposals(processed: jax.Array, t: SamplingTensors, greedy: jax.Array,
                     greedy_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Speculative decoding's rejection sampling, per logits row: -> (token, accepted), both [S].

    A row whose proposal x (`t.draft_token_ids`, -1: none) is accepted yields x; otherwise it yields its own
    sample, which for a rejected row comes from the residual distribution. Greedy rows accept x when it is the
    argmax (their token is the argmax either way). Sampled rows accept x with probability min(1, p(x) / q(x)),
    and the proposers so far propose deterministically (q(x) = 1), so with probability p(x); the residual
    (p - q)+ normalized is then p with x removed, which Gumbel-max samples by masking x. Either way the token has
    exactly the target's distribution p (docs/architecture/08-sampling.md, "Speculative decoding"). The uniform draw and
    the Gumbel noise come from the row's (seed, position) counter like any sample, on separate streams.
    """
    draft = t.draft_token_ids
    has_draft = draft >= 0

    def sampled_rows() -> tuple[jax.Array, jax.Array]:
        filtered = _filtered_logits(processed, t, greedy)
        log_p = jax.nn.log_softmax(filtered, axis=-1)
        log_p_draft = jnp.take_along_axis(log_p, jnp.maximum(draft, 0)[:, None], axis=-1)[:, 0]
        accept = has_draft & (jnp.log(_acceptance_uniforms(t.seeds, t.positions)) < log_p_draft)
        column = jnp.arange(filtered.shape[-1], dtype=jnp.int32)[None, :]
        residual = jnp.where(has_draft[:, None] & (column == draft[:, None]), -jnp.inf, filtered)
        noise = gumbel_noise(t.seeds, t.positions, filtered.shape[-1])
        return row_argmax(_materialized(residual + noise)), accept

    random_ids, random_accept = jax.lax.cond(jnp.all(greedy), lambda: (greedy_ids, jnp.zeros_like(has_draft)),
                                             sampled_rows)
    accepted = has_draft & jnp.where(greedy, draft == greedy_ids, random_accept)
    token_ids = jnp.where(accepted, draft, jnp.where(greedy, greedy_ids, random_ids))
    return token_ids, accepted


def _acceptance_uniforms(seeds: jax.Array, positions: jax.Array) -> jax.Array:
    """[S] uniforms in (0, 1) for the acceptance test, independent of the same row's Gumbel noise."""

    def row(seed: jax.Array, position: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), position), 1)
        return jax.random.uniform(key, (), jnp.float32, minval=jnp.finfo(jnp.float32).tiny, maxval=1.0)

    return jax.vmap(row)(seeds.astype(jnp.uint32), positions.astype(jnp.int32))


def row_argmax(x: jax.Array, chunk: int = ARGMAX_CHUNK) -> jax.Array:
    """`jnp.argmax(x, axis=-1)` as int32 (first index among ties, NaN counts as largest), in two levels: each
    chunk's max, the first chunk holding the row's max, then the first max inside it.

    Why: XLA:CPU lowers argmax to a variadic (value, index) reduce that does not vectorize, 18 ms for
    [256, 32000] on this project's CPU against 0.7 ms for a plain max; the two levels take ~1.5 ms. Accelerators
    get the same result from the same reductions.
    """
    rows, vocab = x.shape
    if vocab <= chunk:
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    pad = (-vocab) % chunk
    if pad:
        x = jnp.pad(x, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    chunks = x.reshape(rows, -1, chunk)
    best_chunk = jnp.argmax(jnp.max(chunks, axis=-1), axis=-1).astype(jnp.int32)  # [S]
    inside = jnp.take_along_axis(chunks, best_chunk[:, None, None], axis=1)[:, 0]  # [S, chunk]
    return best_chunk * chunk + jnp.argmax(inside, axis=-1).astype(jnp.int32)


def compute_logprobs(logits: jax.Array, token_ids: jax.Array, num_logprobs: int) -> tuple[jax.Array, jax.Array,
                                                                                          jax.Array]:
    """Raw-distribution logprobs and 1-based ranks of `token_ids` [N] and of the top-K tokens of `logits` [N, V].

    Returns (ids, logprobs, ranks), each [N, 1+K] with the given token in column 0. A token's rank is
    1 + the number of tokens with a strictly larger logit, so tied tokens share a rank, and a token gets the
    same rank whether it is the given token or one of the top-K. Among ties, top-K lists lower ids first.
    """
    logits = logits.astype(jnp.float32)
    num_logprobs = min(max(int(num_logprobs), 0), logits.shape[-1])
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    token_ids = token_ids.astype(jnp.int32)[:, None]
    token_logit = jnp.take_along_axis(logits, token_ids, axis=-1)  # [N, 1]
    token_lp = jnp.take_along_axis(logprobs, token_ids, axis=-1)
    token_rank = 1 + jnp.sum(logits > token_logit, axis=-1, dtype=jnp.int32)[:, None]
    if num_logprobs == 0:
        return token_ids, token_lp, token_rank
    top_logits, top_ids = _top_k(logits, num_logprobs)  # sorted descending
    top_ids = top_ids.astype(jnp.int32)
    top_lp = jnp.take_along_axis(logprobs, top_ids, axis=-1)
    # Every token with a larger logit than a top-K entry is itself in the top-K, so K x K comparisons suffice.
    top_rank = 1 + jnp.sum(top_logits[:, None, :] > top_logits[:, :, None], axis=-1, dtype=jnp.int32)
    return (jnp.concatenate([token_ids, top_ids], axis=-1),
            jnp.concatenate([token_lp, top_lp], axis=-1),
            jnp.concatenate([token_rank, top_rank], axis=-1))


def _top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """`jax.lax.top_k(x, k)`, taken through `top_k_lane_wide` on TPU (docs/architecture/08-sampling.md,
    "Sampling"; measured in docs/accelerators.md, "Ahead-of-time compile checks"). Elsewhere the wider top-k only
    costs (10% more logprobs time on XLA:CPU), so other platforms keep this one."""
    return jax.lax.platform_dependent(x, tpu=lambda x: top_k_lane_wide(x, k),
                                      default=lambda x: tuple(jax.lax.top_k(x, k)))


def top_k_lane_wide(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """`jax.lax.top_k(x, k)` computed `LANES` wide and then cut to k: the same values and ids (ties list lower ids
    first either way). Why: a top-k narrower than a vector lane gets a transposed layout from XLA:TPU, whose TopK
    then compiles in ~5 s instead of ~1 (the sampling program at tensor parallelism 4 in 5 s instead of 8); the
    barrier keeps the cut's narrow layout from reaching the TopK."""
    width = min(-(-k // LANES) * LANES, x.shape[-1])
    values, ids = jax.lax.optimization_barrier(jax.lax.top_k(x, width))
    return values[:, :k], ids[:, :k]


def apply_token_bitmask(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    """-inf for every token whose bit is clear in its row of `bitmask` [S, ceil(V / 32)] int32."""
    vocab = logits.shape[-1]
    bits = jnp.arange(32, dtype=jnp.int32)
    allowed = ((bitmask[:, :, None] >> bits) & 1).reshape(bitmask.shape[0], -1)[:, :vocab]
    return jnp.where(allowed.astype(jnp.bool_), logits, -jnp.inf)


def apply_logits_processors(logits: jax.Array, t: SamplingTensors) -> jax.Array:
    """logit_bias (with its -inf masks), then repetition -> frequency -> presence penalties; identity if basic."""
    if not t.is_full:
        return logits
    logits = logits + t.logit_bias
    seen = t.prompt_mask | (t.output_counts > 0)
    rep = jnp.where(seen, t.repetition_penalties[:, None], 1.0)
    logits = jnp.where(logits > 0, logits / rep, logits * rep)
    logits = logits - t.frequency_penalties[:, None] * t.output_counts.astype(jnp.float32)
    logits = logits - t.presence_penalties[:, None] * (t.output_counts > 0).astype(jnp.float32)
    return logits


def gumbel_noise(seeds: jax.Array, positions: jax.Array, vocab_size: int) -> jax.Array:
    """[S, V] standard Gumbel noise; row i depends only on (seeds[i], positions[i], vocab_size)."""

    def row(seed: jax.Array, position: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.key(seed), position)
        return jax.random.gumbel(key, (vocab_size,), jnp.float32)

    return jax.vmap(row)(seeds.astype(jnp.uint32), positions.astype(jnp.int32))


def _random_sample(logits: jax.Array, t: SamplingTensors, greedy: jax.Array) -> jax.Array:
    """Temperature, min_p, top-k/top-p, then Gumbel-max. Greedy rows pass through harmlessly (T treated as 1)."""
    logits = _filtered_logits(logits, t, greedy)
    noise = gumbel_noise(t.seeds, t.positions, logits.shape[-1])
    return row_argmax(_materialized(logits + noise))


def _materialized(x: jax.Array) -> jax.Array:
    """`x` written out before its consumers read it, so XLA does not fuse the Gumbel noise's RNG into both levels
    of `row_argmax`: the same values, and a third of the sampling program's XLA:TPU compile time for the noise
    and argmax (docs/accelerators.md, "Ahead-of-time compile checks")."""
    return jax.lax.optimization_barrier(x)


def _filtered_logits(logits: jax.Array, t: SamplingTensors, greedy: jax.Array) -> jax.Array:
    """The sampling distribution's logits: divided by temperature, then min_p, then top-k/top-p (-inf outside)."""
    temperature = jnp.where(greedy, 1.0, t.temperature)
    logits = logits / temperature[:, None]
    logits = jax.lax.cond(jnp.any(t.min_p > 0), _apply_min_p, lambda x, _: x, logits, t.min_p)
    use_top = jnp.any((t.top_k > 0) | (t.top_p < 1.0))
    return jax.lax.cond(use_top, apply_top_k_top_p, lambda x, _k, _p: x, logits, t.top_k, t.top_p)


def _apply_min_p(logits: jax.Array, min_p: jax.Array) -> jax.Array:
    """Drop tokens whose probability is below min_p * (the top token's probability)."""
    rel_prob = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))  # p / p_max
    return jnp.where(rel_prob < min_p[:, None], -jnp.inf, logits)


def apply_top_k_top_p(logits: jax.Array, top_k: jax.Array, top_p: jax.Array,
                      num_candidates: int = TOP_CANDIDATES) -> jax.Array:
    """Top-k, then top-p over what top-k kept (vLLM's order), as one per-row logit threshold: logits below -> -inf.

    Top-p keeps the smallest prefix of the sorted distribution whose mass reaches top_p (the top token always
    stays). Tokens tied with the threshold are kept, so the result does not depend on sort order among ties.
    Sorting [S, V] is slow at real vocab sizes, so the cutoff is first sought among the `num_candidates` largest
    logits; only if some row's cutoff lies beyond them does an exact bisection run.
    """
    active = (top_k > 0) | (top_p < 1.0)
    top_k = jnp.minimum(top_k, logits.shape[-1])
    width = min(num_candidates, logits.shape[-1])
    candidates = jax.lax.top_k(logits, width)[0]  # [S, W] sorted descending
    threshold, exact = _candidate_threshold(candidates, jax.nn.logsumexp(logits, axis=-1), top_k, top_p)
    threshold = jax.lax.cond(jnp.all(exact | ~active), lambda: threshold,
                             lambda: _bisection_threshold(logits, top_k, top_p))
    threshold = jnp.where(active, threshold, -jnp.inf)
    return jnp.where(logits < threshold[:, None], -jnp.inf, logits)


def _candidate_threshold(sorted_desc: jax.Array, lse_all: jax.Array, top_k: jax.Array,
                         top_p: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-row smallest kept logit from the W largest logits [S, W], and whether the cutoff lies within them."""
    width = sorted_desc.shape[-1]
    index = jnp.arange(width, dtype=jnp.int32)[None, :]
    k_on = top_k > 0
    in_top_k = ~k_on[:, None] | (index < top_k[:, None])
    # top-p renormalizes over what top-k kept; without top-k that is the whole row.
    lse = jnp.where(k_on, jax.nn.logsumexp(jnp.where(in_top_k, sorted_desc, -jnp.inf), axis=-1), lse_all)
    probs = jnp.where(in_top_k, jnp.exp(sorted_desc - lse[:, None]), 0.0)
    cum = jnp.cumsum(probs, axis=-1)
    mass_before = jnp.concatenate([jnp.zeros_like(cum[:, :1]), cum[:, :-1]], axis=-1)  # exclusive cumsum
    p_off = top_p >= 1.0
    keep = in_top_k & ((mass_before < top_p[:, None]) | p_off[:, None])
    count = jnp.maximum(jnp.sum(keep, axis=-1, dtype=jnp.int32), 1)
    threshold = jnp.take_along_axis(sorted_desc, count[:, None] - 1, axis=-1)[:, 0]
    kept_mass = jnp.take_along_axis(cum, count[:, None] - 1, axis=-1)[:, 0]
    exact = jnp.where(k_on, top_k <= width, p_off | (count < width) | (kept_mass >= top_p))
    return threshold, exact


def _bisection_threshold(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """The same threshold without sorting: the smallest float t with count(> t) < k, then the smallest t with
    top-k-renormalized mass(> t) < p, each found by 32 bisection steps over the order-preserving uint32 keys."""

    def search(pred: Callable[[jax.Array], jax.Array]) -> jax.Array:
        def body(_: int, bounds: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
            lo, hi = bounds
            mid = lo + (hi - lo) // 2
            ok = pred(_from_key(mid)[:, None])[:, 0]
            return jnp.where(ok, lo, mid + 1), jnp.where(ok, mid, hi)

        bounds = (_to_key(jnp.min(logits, axis=-1)), _to_key(jnp.max(logits, axis=-1)))  # pred(max) holds
        return _from_key(jax.lax.fori_loop(0, 32, body, bounds)[1])

    k_on = (top_k > 0)[:, None]
    t_k = search(lambda t: ~k_on | (jnp.sum(logits > t, axis=-1, keepdims=True) < top_k[:, None]))[:, None]
    kept = logits >= t_k
    lse = jax.nn.logsumexp(jnp.where(kept, logits, -jnp.inf), axis=-1, keepdims=True)
    probs = jnp.where(kept, jnp.exp(logits - lse), 0.0)
    p_off = (top_p >= 1.0)[:, None]
    t_p = search(lambda t: p_off | (jnp.sum(jnp.where(logits > t, probs, 0.0), axis=-1, keepdims=True)
                                    < top_p[:, None]))
    return jnp.maximum(t_k[:, 0], t_p)


def _to_key(x: jax.Array) -> jax.Array:
    """float32 -> uint32 with the same order (negative floats flipped below positive ones)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _from_key(key: jax.Array) -> jax.Array:
    bits = jnp.where(key >> 31 == 1, key & jnp.uint32(0x7FFFFFFF), ~key)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)

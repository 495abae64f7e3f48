"""Tests of specjax.sampling: warping, and exactness of one speculative step.

Statistical tests use fixed seeds and a chi-square test at significance 0.001 (they fail with probability
0.001 for a correct implementation and a fresh seed; with the fixed seeds they are deterministic).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specjax.decoding.verify import accept_or_resample
from specjax.sampling import (
    Sampler,
    acceptance_probability,
    argmax,
    residual,
    sample_from,
    validate_sampling,
)

SIGNIFICANCE = 0.001


def _random_logits(seed, shape, scale=2.0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32) * scale


# ----------------------------------------------------------------------------------------------------------
# Warping


def test_probs_are_float32_distributions_for_every_warping():
    logits = jnp.asarray(_random_logits(0, (5, 11)), jnp.bfloat16)
    for sampler in (Sampler(), Sampler(0.7, 3), Sampler(1.0, 0, 0.8), Sampler(1.3, 5, 0.5), Sampler(0.0)):
        probs = sampler.probs(logits)
        assert probs.dtype == jnp.float32 and probs.shape == (5, 11)
        np.testing.assert_allclose(np.sum(probs, -1), 1.0, atol=1e-6)
        assert np.all(np.asarray(probs) >= 0)


def test_temperature_one_is_softmax_and_temperature_scales_logits():
    logits = _random_logits(1, (3, 7))
    np.testing.assert_allclose(Sampler().probs(logits), jax.nn.softmax(logits), rtol=1e-6)
    np.testing.assert_allclose(Sampler(0.5).probs(logits), jax.nn.softmax(logits / 0.5), rtol=1e-5)


def test_argmax_equals_numpy_first_index_on_ties_and_nans():
    # specjax.sampling.argmax (max + first index, XLA:CPU-friendly) against numpy's argmax: random rows,
    # rows with tied maxima (first index wins), -inf, a NaN (numpy: the first NaN), shapes [v], [b, v], [b, k, v].
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 257)).astype(np.float32)
    x[0, 1, [5, 77, 200]] = 10.0  # a three-way tie: 5
    x[1, 2, :] = -np.inf  # all -inf: 0
    x[2, 0, [9, 30]] = np.nan  # NaNs: the first NaN, 9
    x[2, 3, -1] = np.float32(3e38)  # the last index
    for arr in (x, x[0], x[1, 2]):
        got = np.asarray(jax.jit(argmax)(jnp.asarray(arr)))
        np.testing.assert_array_equal(got, np.argmax(arr, axis=-1))
    assert jax.jit(argmax)(jnp.asarray(x)).dtype == jnp.int32


def test_temperature_zero_is_one_hot_argmax():
    logits = _random_logits(2, (4, 9))
    probs = np.asarray(Sampler(0.0, top_k=3, top_p=0.5).probs(logits))
    np.testing.assert_array_equal(probs, np.eye(9)[np.argmax(logits, -1)])
    np.testing.assert_array_equal(Sampler(0.0).sample(None, probs), np.argmax(logits, -1))


def test_top_k_keeps_the_k_largest():
    logits = np.array([[0.1, 3.0, -1.0, 2.0, 0.5]], np.float32)
    probs = np.asarray(Sampler(1.0, top_k=2).probs(logits))[0]
    expected = np.zeros(5)
    expected[[1, 3]] = jax.nn.softmax(np.array([3.0, 2.0]))
    np.testing.assert_allclose(probs, expected, rtol=1e-6)
    # top_k >= vocab keeps everything.
    np.testing.assert_allclose(Sampler(1.0, top_k=50).probs(logits), jax.nn.softmax(logits), rtol=1e-6)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    base = np.array([0.5, 0.3, 0.15, 0.05], np.float32)
    logits = np.log(base)[None]
    # 0.5 < 0.6 -> also 0.3 (mass 0.8 >= 0.6); stop.
    np.testing.assert_allclose(Sampler(1.0, top_p=0.6).probs(logits)[0], [0.625, 0.375, 0, 0], rtol=1e-5)
    np.testing.assert_allclose(Sampler(1.0, top_p=0.5).probs(logits)[0], [1, 0, 0, 0], rtol=1e-6)
    np.testing.assert_allclose(Sampler(1.0, top_p=0.81).probs(logits)[0], np.append(base[:3] / 0.95, 0), rtol=1e-5)
    np.testing.assert_allclose(Sampler(1.0, top_p=1.0).probs(logits)[0], base, rtol=1e-5)


def test_residual_and_acceptance_probability():
    p = jnp.array([0.5, 0.3, 0.2, 0.0])
    q = jnp.array([0.2, 0.3, 0.1, 0.4])
    np.testing.assert_allclose(residual(p, q), [0, 0, 0, 1.0])
    np.testing.assert_allclose(residual(q, p), [0.75, 0, 0.25, 0])
    np.testing.assert_allclose(residual(p, p), p)  # no mass to move: falls back to q
    np.testing.assert_allclose(acceptance_probability(p, q), [0.4, 1.0, 0.5, 1.0])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-0.1),
        dict(temperature=float("nan")),
        dict(top_k=-1),
        dict(top_k=1.5),
        dict(top_p=0.0),
        dict(top_p=1.01),
        dict(top_p=-0.5),
    ],
)
def test_bad_settings_raise(kwargs):
    settings = dict(temperature=1.0, top_k=0, top_p=1.0) | kwargs
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        validate_sampling(**settings)
    with pytest.raises(ValueError, match=name):
        Sampler(**settings)


# ----------------------------------------------------------------------------------------------------------
# Exactness of one step (Leviathan et al. 2023, section 2.3)


def _pairs():
    """(p, q) pairs over small vocabularies, some with zeros (top-k warped), as float32 numpy."""
    out = []
    for seed, vocab, p_warp, q_warp in [
        (0, 5, Sampler(), Sampler()),
        (1, 8, Sampler(1.0, 4), Sampler(0.7)),
        (2, 6, Sampler(0.8), Sampler(1.0, 0, 0.7)),
        (3, 3, Sampler(), Sampler(2.0)),
    ]:
        lp, lq = _random_logits(seed, (2, vocab))
        out.append((np.asarray(p_warp.probs(lp)), np.asarray(q_warp.probs(lq))))
    return out


@pytest.mark.parametrize("pair", range(4))
def test_one_step_distribution_is_exactly_q(pair):
    """P(x) = p(x) min(1, q(x)/p(x)) + (1 - sum min(p, q)) residual(x) equals q(x), from the acceptance
    code's own functions."""
    p, q = map(jnp.asarray, _pairs()[pair])
    accept = p * acceptance_probability(p, q)
    reject_mass = 1.0 - jnp.sum(jnp.minimum(p, q))
    np.testing.assert_allclose(jnp.sum(accept), jnp.sum(jnp.minimum(p, q)), atol=1e-6)
    np.testing.assert_allclose(accept + reject_mass * residual(p, q), q, atol=1e-6)


@jax.jit
def _first_emitted_tokens(keys, p, q, q_bonus):
    """For each key: draw x ~ p, run the gamma = 1 verification, return the first emitted token."""

    def one(key):
        key_draft, key_verify = jax.random.split(key)
        x = sample_from(key_draft, p)
        num_accepted, next_token = accept_or_resample(key_verify, x[None], p[None], jnp.stack([q, q_bonus]))
        return jnp.where(num_accepted == 1, x, next_token)

    return jax.vmap(one)(keys)


@pytest.mark.parametrize("pair", range(4))
def test_one_step_samples_match_q_chi_square(pair):
    """200k samples of the first emitted token; chi-square against q at significance 0.001."""
    p, q = _pairs()[pair]
    n = 200_000
    keys = jax.random.split(jax.random.PRNGKey(100 + pair), n)
    tokens = np.asarray(_first_emitted_tokens(keys, jnp.asarray(p), jnp.asarray(q), jnp.asarray(p)))
    counts = np.bincount(tokens, minlength=len(q))
    support = q > 0
    assert counts[~support].sum() == 0, "a token the target gives probability 0 was emitted"
    q64 = q[support].astype(np.float64)
    expected = q64 / q64.sum() * n
    result = stats.chisquare(counts[support], expected)
    assert result.pvalue > SIGNIFICANCE, (counts, expected, result)


def test_greedy_verification_accepts_while_argmax_matches():
    v = 5
    q = jax.nn.one_hot(jnp.array([2, 3, 4, 0]), v)  # target argmax at 4 positions (gamma = 3)
    p = jax.nn.one_hot(jnp.array([2, 3, 1]), v)
    a, t = accept_or_resample(jax.random.PRNGKey(0), jnp.array([2, 3, 1]), p, q, greedy=True)
    assert (int(a), int(t)) == (2, 4)
    a, t = accept_or_resample(
        jax.random.PRNGKey(0), jnp.array([2, 3, 4]), jax.nn.one_hot(jnp.array([2, 3, 4]), v), q, greedy=True
    )
    assert (int(a), int(t)) == (3, 0)  # all accepted: the bonus argmax
    # The stochastic rule with one-hot p and q gives the same answer.
    a, t = accept_or_resample(jax.random.PRNGKey(0), jnp.array([2, 3, 1]), p, q, greedy=False)
    assert (int(a), int(t)) == (2, 4)

"""Tests of specjax.decoding: exactness of speculative sampling, greedy identity, edges, bad input, and the
shape of the compiled program.

Statistical tests use fixed seeds and a chi-square test at significance 0.001 (bins with expected count
< 5 are merged into one).
"""

import dataclasses
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specjax import T5Config, T5Model, decoding, speculative_sample, temperature_sample
from specjax.decoding import DecodeResult, lower_speculative_sample, lower_temperature_sample
from specjax.sampling import Sampler

SIGNIFICANCE = 0.001
EOS = 1


# ----------------------------------------------------------------------------------------------------------
# Hand-made models (t5x decoding_test.py style): exact logits, explicit caches


@dataclasses.dataclass(frozen=True)
class PositionTable:
    """Logits depend only on the decoder position: params float32[P, v] (row = position)."""

    vocab_size: int
    pad_id: int = 0

    def encode(self, params, encoder_input_tokens):
        return encoder_input_tokens

    def init_cache(self, batch, length):
        return jnp.zeros((batch,), jnp.int32)

    def decode(self, params, encoded, tokens, cache, positions):
        pos = positions[:, None] + jnp.arange(tokens.shape[1])[None, :]  # [b, k]
        return params[jnp.minimum(pos, params.shape[0] - 1)], cache


@dataclasses.dataclass(frozen=True)
class Trigram:
    """Logits depend on the last two decoder inputs, read from a token-history cache int32[b, L]:
    params float32[v, v, v] indexed [previous input, current input]. A cache that misses a token gives
    different logits, so this checks each model's cache invariant."""

    vocab_size: int
    pad_id: int = 0

    def encode(self, params, encoder_input_tokens):
        return encoder_input_tokens

    def init_cache(self, batch, length):
        return jnp.full((batch, length), -1, jnp.int32)

    def decode(self, params, encoded, tokens, cache, positions):
        b, k = tokens.shape
        pos = positions[:, None] + jnp.arange(k)[None, :]  # [b, k]
        cache = cache.at[jnp.arange(b)[:, None], pos].set(tokens, mode="drop")
        prev = jnp.take_along_axis(cache, jnp.maximum(pos - 1, 0), axis=1)
        prev = jnp.where(pos > 0, prev, self.pad_id)
        # A slot never written (-1) would index out of range: make it loud with NaN logits.
        logits = params[jnp.maximum(prev, 0), tokens]
        return jnp.where((prev >= 0)[..., None], logits, jnp.nan), cache


def _one_hot_rows(tokens, vocab, scale=30.0):
    return jnp.asarray(np.eye(vocab, dtype=np.float32)[tokens] * scale)


# ----------------------------------------------------------------------------------------------------------
# Tiny T5 models


def _t5_config(vocab=8, d=16):
    return T5Config(
        vocab_size=vocab,
        d_model=d,
        num_heads=2,
        head_dim=8,
        mlp_dim=32,
        num_encoder_layers=2,
        num_decoder_layers=2,
        name="tiny",
    )


def _scaled(model, factor):
    """The model with its output kernel scaled: logits * factor (peakier distributions)."""
    params = jax.tree_util.tree_map(lambda x: x, model.params)
    params["decoder"]["logits_dense"]["kernel"] = params["decoder"]["logits_dense"]["kernel"] * factor
    return T5Model(model.config, params)


def _perturbed(model, scale, seed):
    """The model with Gaussian noise of relative size ``scale`` on every parameter (a 'close' draft)."""
    leaves, tree = jax.tree_util.tree_flatten(model.params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return T5Model(model.config, jax.tree_util.tree_unflatten(tree, noisy))


def _inputs(rng, rows, width, vocab, min_len=1):
    """Right-padded inputs int32[rows, width] of mixed lengths, each ending with EOS."""
    out = np.zeros((rows, width), np.int32)
    for i in range(rows):
        n = rng.integers(min_len, width + 1)
        out[i, : n - 1] = rng.integers(2, vocab, n - 1)
        out[i, n - 1] = EOS
    return out


def _check_well_formed(result: DecodeResult, max_decode_length, eos=EOS, pad=0):
    seqs, lengths = result.sequences, result.lengths
    assert seqs.shape[1] == max_decode_length
    assert np.all((lengths >= 1) & (lengths <= max_decode_length))
    for row, n in zip(seqs, lengths):
        eos_at = np.flatnonzero(row[:n] == eos)
        if n < max_decode_length:
            assert list(eos_at) == [n - 1], (row, n)  # ended at its first EOS
        else:
            assert len(eos_at) == 0 or eos_at[0] == n - 1, (row, n)
        assert np.all(row[n:] == pad)


# ----------------------------------------------------------------------------------------------------------
# Exact loop logic with hand-made logits


def test_counters_and_eos_mid_window_with_hand_made_logits():
    v, P = 10, 32
    target_tokens = [2, 3, 4, 5, 6, 1] + [7] * (P - 6)
    draft_tokens = [2, 3, 9, 5, 6, 1] + [7] * (P - 6)  # wrong at index 2
    target = (PositionTable(v), _one_hot_rows(target_tokens, v))
    draft = (PositionTable(v), _one_hot_rows(draft_tokens, v))
    x = np.array([[5, 1]])
    base = temperature_sample(target, x, rng=0, max_decode_length=10, temperature=0)
    assert base.sequences[0].tolist() == [2, 3, 4, 5, 6, 1, 0, 0, 0, 0] and base.lengths[0] == 6
    assert base.num_target_calls[0] == 6 and np.isnan(base.acceptance_rate)
    # gamma = 3: iteration 1 drafts [2, 3, 9], keeps 2, emits 4; iteration 2 drafts [5, 6, 1], keeps all
    # three (EOS last) and ends the row there (no bonus).
    r = speculative_sample(target, draft, x, rng=0, gamma=3, max_decode_length=10, temperature=0)
    assert r.sequences[0].tolist() == base.sequences[0].tolist()
    assert (r.lengths[0], r.num_target_calls[0], r.num_draft_tokens[0], r.num_accepted[0]) == (6, 2, 6, 5)
    # gamma = 5: iteration 2 drafts [5, 6, 1, 7, 7]; the EOS is accepted mid-window and ends the row; the
    # drafts after the drafted EOS are not counted.
    r = speculative_sample(target, draft, x, rng=0, gamma=5, max_decode_length=10, temperature=0)
    assert r.sequences[0].tolist() == base.sequences[0].tolist()
    assert (r.lengths[0], r.num_target_calls[0], r.num_draft_tokens[0], r.num_accepted[0]) == (6, 2, 8, 5)
    assert r.tokens_per_target_call == 3.0 and r.accepted_fraction == 5 / 8
    # The paper's alpha: verified positions are the accepted ones and the first rejected one (beta 1, 1, 0
    # in iteration 1; 1, 1, 1 in iteration 2, the drafts after the drafted EOS never verified).
    assert r.acceptance_rate == 5 / 6 and r.num_verified[0] == 6
    np.testing.assert_array_equal(r.accepted_per_position[0], [2, 2, 1, 0, 0])
    # Also when sampling (temperature 1, near one-hot): the EOS ends the row mid-window.
    r = speculative_sample(target, target, np.tile(x, (8, 1)), rng=1, gamma=5, max_decode_length=10)
    assert np.all(r.sequences == base.sequences) and np.all(r.num_target_calls == 1)


def test_draft_equal_to_target_accepts_everything_with_cache_dependent_logits():
    v = 7
    params = jnp.asarray(np.random.default_rng(0).normal(size=(v, v, v)).astype(np.float32) * 3)
    params = params.at[:, :, EOS].add(-100.0)  # never end early: long windows
    model = (Trigram(v), params)
    x = np.array([[3, 1], [4, 1], [2, 1]])
    base = temperature_sample(model, x, rng=0, max_decode_length=13, temperature=0)
    for gamma in (1, 2, 4, 5):
        r = speculative_sample(model, model, x, rng=0, gamma=gamma, max_decode_length=13, temperature=0)
        np.testing.assert_array_equal(r.sequences, base.sequences)
        assert r.acceptance_rate == 1.0, gamma
        # Every iteration emits gamma + 1 tokens until the budget is reached.
        assert np.all(r.num_target_calls == -(-13 // (gamma + 1)))
    # At temperature 1 p == q exactly, so every draft is accepted too.
    r = speculative_sample(model, model, np.tile(x, (20, 1)), rng=3, gamma=3, max_decode_length=13)
    assert r.acceptance_rate == 1.0
    _check_well_formed(r, 13)


def test_greedy_identity_with_cache_dependent_hand_made_models():
    v = 9
    rng = np.random.default_rng(1)
    target = (Trigram(v), jnp.asarray(rng.normal(size=(v, v, v)).astype(np.float32) * 2))
    draft_params = target[1] + jnp.asarray(rng.normal(size=(v, v, v)).astype(np.float32))
    draft = (Trigram(v), draft_params)
    x = _inputs(rng, 12, 5, v)
    base = temperature_sample(target, x, rng=0, max_decode_length=15, temperature=0)
    for gamma in (1, 3, 7, 20):
        r = speculative_sample(target, draft, x, rng=0, gamma=gamma, max_decode_length=15, temperature=0)
        np.testing.assert_array_equal(r.sequences, base.sequences)
        np.testing.assert_array_equal(r.lengths, base.lengths)
        assert 0 < r.acceptance_rate < 1


@pytest.mark.parametrize("threshold", [None, 0.6])
def test_model_draft_catch_up_after_partial_and_full_acceptance(threshold):
    """``ModelDraft``'s cache across iterations: its first step is one token ``d[n]`` while every row already
    holds ``d[n-1]``, and the 2-token window ``[d[n-1], d[n]]`` when some row accepted every draft (the draft
    never consumed its last token). Driven through scripted accept counts (full and partial, differing
    between rows, so both branches run, at n = 0 and later), every proposal must equal the Trigram draft's
    greedy continuation of the emitted prefix computed in NumPy: a cache that missed ``d[n-1]`` or held a stale
    token gives other tokens (or NaN logits). With a confidence threshold the rows draft 1 to γ tokens and
    accept at most what they drafted."""
    from specjax.decoding.drafts import ModelDraft
    from specjax.decoding.inputs import row_keys
    from specjax.decoding.loop import split_rows
    from specjax.sampling import SamplingParams

    v, b, T, g = 11, 3, 40, 3
    rng = np.random.default_rng(7)
    table = rng.normal(size=(v, v, v)).astype(np.float32) * 3
    table[:, :, EOS] = -100.0  # the draft never proposes EOS
    params = jnp.asarray(table)
    draft = ModelDraft(Trigram(v), confidence_threshold=threshold)
    context, carry = draft.start(params, np.zeros((b, 2), np.int32), T + g + 1)
    sequences, n = np.zeros((b, T), np.int32), np.zeros((b,), np.int32)
    sampling = SamplingParams.broadcast(b, 0.0)
    keys = split_rows(row_keys(jax.random.PRNGKey(0), b), g)  # [g, b, 2]; greedy rows do not read them
    schedule = [[1, 0, 2], [g, 0, 1], [1, 2, 0], [0, g, g], [2, 1, 0], [g, g, g], [0, 0, 0], [2, g, 1]]
    branches = set()
    for accept in schedule:
        branches.add(bool(np.any(n > np.asarray(carry[1]))))  # True: the 2-token window runs
        proposal, carry = draft.propose(
            params, context, carry, jnp.asarray(sequences), jnp.asarray(n), keys, sampling, g
        )
        tokens, lengths = np.asarray(proposal.tokens), np.asarray(proposal.lengths)
        for i in range(b):
            d = [0] + list(sequences[i, : n[i]])  # decoder inputs d[0..n]
            prev, cur = (d[-2] if len(d) > 1 else 0), d[-1]
            want = []
            for _ in range(g):
                want.append(int(np.argmax(table[prev, cur])))
                prev, cur = cur, want[-1]
            assert 1 <= lengths[i] <= g and (threshold is not None or lengths[i] == g)
            np.testing.assert_array_equal(tokens[i, : lengths[i]], want[: lengths[i]])
            a = min(accept[i], int(lengths[i]))
            nxt = 2 + (tokens[i, a] - 1) % (v - 2) if a < lengths[i] else int(rng.integers(2, v))  # != x_{a+1}
            sequences[i, n[i] : n[i] + a + 1] = list(tokens[i, :a]) + [nxt]
            n[i] += a + 1
    assert branches == {False, True}


# ----------------------------------------------------------------------------------------------------------
# 2. Exactness end to end with tiny T5 models (enumeration of every sequence)


def _exact_sequence_distribution(model, inputs, sampler, max_len, eos=EOS):
    """{(input row, output tuple): probability} from teacher-forced target logits (warped by sampler).

    Sequences end at their first EOS (kept) or at max_len tokens."""
    v = model.config.vocab_size
    full = np.array(list(itertools.product(range(v), repeat=max_len)), np.int32)  # [v^T, T]
    dec_in = np.concatenate([np.zeros((len(full), 1), np.int32), full[:, :-1]], axis=1)
    dist = {}
    for i, row in enumerate(inputs):
        logits = model.logits(np.tile(row[None], (len(full), 1)), dec_in)  # [v^T, T, v]
        q = np.asarray(sampler.probs(logits), np.float64)
        step = np.take_along_axis(q, full[:, :, None], axis=2)[:, :, 0]  # [v^T, T]
        for seq, probs in zip(full, step):
            eos_at = np.flatnonzero(seq == eos)
            n = eos_at[0] + 1 if len(eos_at) else max_len
            dist[(i, tuple(seq[:n]))] = float(np.prod(probs[:n]))
    return dist


def _chi_square(observed: dict, dist: dict, rows_per_input: dict):
    """Chi-square of observed counts against rows_per_input[i] * P(seq | i); rare bins merged."""
    keys = list(dist)
    expected = np.array([rows_per_input[k[0]] * dist[k] for k in keys])
    counts = np.array([observed.get(k, 0) for k in keys], np.float64)
    unknown = sum(c for k, c in observed.items() if k not in dist)
    assert unknown == 0
    impossible = counts[expected == 0].sum()
    assert impossible == 0, "sampled a sequence the warped target gives probability 0"
    big = expected >= 5
    exp = np.append(expected[big], expected[~big].sum())
    obs = np.append(counts[big], counts[~big].sum())
    if exp[-1] < 5:  # merged bin still too small: fold it into the smallest regular bin
        j = np.argmin(exp[:-1])
        exp[j] += exp[-1]
        obs[j] += obs[-1]
        exp, obs = exp[:-1], obs[:-1]
    obs_total, exp_total = obs.sum(), exp.sum()
    exp = exp * (obs_total / exp_total)  # remove float64 rounding of the totals
    return stats.chisquare(obs, exp), len(exp)


@pytest.fixture(scope="module")
def tiny_pair():
    config = _t5_config(vocab=6)
    target = _scaled(T5Model.random(config, seed=0), 3.0)
    draft = _scaled(T5Model.random(config, seed=1), 2.0)
    return target, draft


E2E_CASES = [  # (warping, gamma, distinct inputs in the batch); every warping, gamma and batch is covered
    (dict(temperature=1.0), 1, 1),
    (dict(temperature=1.0), 6, 7),
    (dict(temperature=0.7, top_k=3), 3, 1),
    (dict(temperature=0.7, top_k=3), 6, 7),
    (dict(top_p=0.8), 1, 7),
    (dict(top_p=0.8), 3, 1),
]


@pytest.mark.slow
@pytest.mark.parametrize("warp,gamma,batch", E2E_CASES)
def test_speculative_samples_match_target_sequence_distribution(tiny_pair, warp, gamma, batch):
    """>= 100k speculative samples vs. the target's exact sequence distribution (chi-square, 0.001)."""
    target, draft = tiny_pair
    max_len = 4
    inputs = _inputs(np.random.default_rng(batch), batch, 5, 6)
    sampler = Sampler(**warp)
    dist = _exact_sequence_distribution(target, inputs, sampler, max_len)
    chunks, per_chunk = 5, 20_006 // batch  # 5 calls of ~20k rows
    observed, rows_per_input = {}, dict.fromkeys(range(batch), 0)
    alpha = []
    for c in range(chunks):
        tiled = np.tile(inputs, (per_chunk, 1))
        r = speculative_sample(
            target, draft, tiled, rng=jax.random.PRNGKey(1000 + c), gamma=gamma, max_decode_length=max_len, **warp
        )
        alpha.append(r.acceptance_rate)
        for idx, (seq, n) in enumerate(zip(r.sequences, r.lengths)):
            key = (idx % batch, tuple(seq[:n].tolist()))
            observed[key] = observed.get(key, 0) + 1
        for i in range(batch):
            rows_per_input[i] += per_chunk
    total = sum(rows_per_input.values())
    assert total >= 100_000
    result, bins = _chi_square(observed, dist, rows_per_input)
    print(
        f"\n{warp} gamma={gamma} batch={batch}: n={total} bins={bins} chi2={result.statistic:.1f} "
        f"p={result.pvalue:.3f} alpha={np.mean(alpha):.3f}"
    )
    assert 0.01 < np.mean(alpha) < 0.99  # the test exercises both acceptance and rejection
    assert result.pvalue > SIGNIFICANCE


# ----------------------------------------------------------------------------------------------------------
# 3. Greedy identity with tiny T5 models


@pytest.mark.parametrize("draft_kind", ["independent", "perturbed"])
def test_greedy_speculative_equals_greedy_baseline(draft_kind):
    """200 inputs of mixed lengths, batches of 50, gamma in {1, 2, 4, 8}: token for token, fp32."""
    config = _t5_config(vocab=32, d=32)
    target = T5Model.random(config, seed=3)
    draft = T5Model.random(config, seed=4) if draft_kind == "independent" else _perturbed(target, 0.1, 5)
    inputs = _inputs(np.random.default_rng(7), 200, 12, 32)
    max_len = 16
    alphas = []
    for start in range(0, 200, 50):
        batch = inputs[start : start + 50]
        base = temperature_sample(target, batch, rng=0, max_decode_length=max_len, temperature=0)
        for gamma in (1, 2, 4, 8):
            r = speculative_sample(target, draft, batch, rng=0, gamma=gamma, max_decode_length=max_len, temperature=0)
            np.testing.assert_array_equal(r.sequences, base.sequences, err_msg=f"gamma={gamma}")
            np.testing.assert_array_equal(r.lengths, base.lengths)
            alphas.append(r.acceptance_rate)
    if draft_kind == "perturbed":
        assert 0.3 < np.mean(alphas) < 1.0  # mostly accepted, some rejections


# ----------------------------------------------------------------------------------------------------------
# 4. Edges with tiny T5 models. Most tests share one setting (batch 32, width 6, max_decode_length 10,
# gamma 3, temperature 1) so they reuse one compiled program.

B, WIDTH, MAX_LEN, GAMMA = 32, 6, 10, 3


@pytest.fixture(scope="module")
def t5_pair():
    config = _t5_config(vocab=16)
    return _scaled(T5Model.random(config, seed=10), 2.0), _scaled(T5Model.random(config, seed=11), 2.0)


@pytest.fixture(scope="module")
def t5_inputs():
    return _inputs(np.random.default_rng(0), B, WIDTH, 16)


@pytest.mark.parametrize("gamma,max_len", [(8, 3), (4, 7)])
def test_max_decode_length_is_never_exceeded(t5_pair, t5_inputs, gamma, max_len):
    """gamma larger than max_decode_length, and larger than the room left after a full accept."""
    target, draft = t5_pair
    for model in (draft, target):  # draft == target: every window fully accepted, gamma + 1 per call
        r = speculative_sample(target, model, t5_inputs, rng=2, gamma=gamma, max_decode_length=max_len)
        assert r.sequences.shape == (B, max_len)
        _check_well_formed(r, max_len)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_gamma_zero_is_the_target_alone(t5_pair, t5_inputs, temperature):
    """speculative_sample(gamma=0) is temperature_sample: the same tokens (greedy and sampled, same keys) and the
    same counters (one target call per token, nothing drafted or verified); the draft is never run."""
    target, draft = t5_pair
    kw = dict(rng=3, max_decode_length=7, temperature=temperature)
    r = jax.device_get(speculative_sample(target, draft, t5_inputs, gamma=0, **kw))
    base = jax.device_get(temperature_sample(target, t5_inputs, **kw))
    for field in ("sequences", "lengths", "num_target_calls", "num_draft_tokens", "num_accepted", "num_verified"):
        np.testing.assert_array_equal(getattr(r, field), getattr(base, field), err_msg=field)
    np.testing.assert_array_equal(r.num_target_calls, r.lengths)
    assert r.num_draft_tokens.sum() == 0 and r.accepted_per_position.shape == (B, 0)
    assert np.isnan(r.acceptance_rate) and r.tokens_per_target_call == 1.0
    assert speculative_sample(target, None, t5_inputs, gamma=0, **kw).sequences.shape == (B, 7)  # no draft needed


def test_eos_ends_rows_and_finished_rows_stop_changing(t5_pair, t5_inputs):
    target, draft = t5_pair
    eos_heavy = _scaled(target, 1.0)
    eos_heavy.params["decoder"]["logits_dense"]["kernel"] = (
        eos_heavy.params["decoder"]["logits_dense"]["kernel"].at[:, EOS].add(0.5)
    )
    r = speculative_sample(eos_heavy, draft, t5_inputs, rng=4, gamma=GAMMA, max_decode_length=MAX_LEN)
    _check_well_formed(r, MAX_LEN)
    assert np.any(r.lengths < MAX_LEN) and np.any(r.lengths > 1)
    assert np.all(r.num_target_calls <= r.lengths)


def test_draft_equal_to_target_has_acceptance_rate_one_at_temperature_zero(t5_pair, t5_inputs):
    target, _ = t5_pair
    base = temperature_sample(target, t5_inputs, rng=0, max_decode_length=MAX_LEN, temperature=0)
    for gamma in (GAMMA, 12):
        r = speculative_sample(target, target, t5_inputs, rng=0, gamma=gamma, max_decode_length=MAX_LEN, temperature=0)
        assert r.acceptance_rate == 1.0
        np.testing.assert_array_equal(r.sequences, base.sequences)
        np.testing.assert_array_equal(r.num_target_calls, -(-r.lengths // (gamma + 1)))


def test_a_row_alone_equals_the_row_in_a_batch(t5_pair, t5_inputs):
    target, draft = t5_pair
    key = jax.random.PRNGKey(42)
    batch = speculative_sample(target, draft, t5_inputs, rng=key, gamma=GAMMA, max_decode_length=MAX_LEN)
    row_keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(B))
    batch = jax.device_get(batch)  # DecodeResult is a pytree of jax arrays: numpy for the host checks
    assert len({tuple(s) for s in batch.sequences}) > 1
    for i in (0, 5, 17, 31):
        alone = speculative_sample(
            target, draft, t5_inputs[i : i + 1], rng=row_keys[i : i + 1], gamma=GAMMA, max_decode_length=MAX_LEN
        )
        np.testing.assert_array_equal(alone.sequences[0], batch.sequences[i])
        assert alone.num_accepted[0] == batch.num_accepted[i]
    # With a single key, row 0 of a batch is the same as the row decoded alone with that key.
    alone0 = speculative_sample(target, draft, t5_inputs[:1], rng=key, gamma=GAMMA, max_decode_length=MAX_LEN)
    np.testing.assert_array_equal(alone0.sequences[0], batch.sequences[0])


def test_decode_result_properties():
    r = DecodeResult(
        np.zeros((2, 3), np.int32),
        np.array([3, 1]),
        np.array([2, 1]),
        np.array([4, 2]),
        np.array([3, 0]),
        np.array([2.5, 0.5], np.float32),
        np.array([4, 1]),
        np.array([[2, 1], [0, 0]]),
    )
    assert r.accepted_fraction == 0.5 and r.tokens_per_target_call == 4 / 3
    assert r.acceptance_rate == 3.0 / 5 and r.mean_accepted_length == 1.0
    np.testing.assert_allclose(r.row_acceptance_rates, [0.625, 0.5])
    np.testing.assert_allclose(r.acceptance_by_position, [2 / 3, 1 / 3])


def test_truncate_cuts_long_batches_and_keeps_eos(t5_pair, t5_inputs):
    target, draft = t5_pair
    long = np.concatenate([t5_inputs, np.zeros((B, 3), np.int32)], axis=1)
    long[0] = [3, 4, 5, 6, 7, 8, 9, 10, 1]  # 9 tokens: cut to 6, ending in EOS
    short = t5_inputs.copy()
    short[0] = [3, 4, 5, 6, 7, 1]
    kwargs = dict(rng=0, gamma=GAMMA, max_decode_length=MAX_LEN)
    a = speculative_sample(target, draft, long, max_input_length=WIDTH, truncate=True, **kwargs)
    b = speculative_sample(target, draft, short, **kwargs)
    np.testing.assert_array_equal(a.sequences, b.sequences)


# ----------------------------------------------------------------------------------------------------------
# 5. Bad input: a clear ValueError before anything compiles


@pytest.fixture
def no_compile(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("compiled before validating")

    monkeypatch.setattr(decoding.loop, "_speculative_jit", fail)
    monkeypatch.setattr(decoding.baseline, "_baseline_jit", fail)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(gamma=-1), "gamma must be an int >= 1"),
        (dict(temperature=-1.0), "temperature must be"),
        (dict(top_p=0.0), "top_p must be in"),
        (dict(top_p=1.5), "top_p must be in"),
        (dict(top_k=-2), "top_k must be"),
        (dict(eos_id=16), "eos_id=16 is outside the vocabulary"),
        (dict(eos_id=-1), "eos_id=-1 is outside"),
        (dict(max_decode_length=0), "max_decode_length must be"),
        (dict(inputs=np.zeros((0, 4), np.int32)), "empty batch"),
        (dict(inputs=np.full((2, 9), 3, np.int32), max_input_length=8), "truncate=True"),
        (dict(inputs=np.array([[3, 99, 1]])), "outside the vocabulary"),
        (dict(inputs=np.array([3, 4, 1])), "2-D"),
        (dict(inputs=["A dog runs.", "Two men talk."]), "look like text .* tokenizer.encode_batch"),
        (dict(inputs="A dog runs."), "look like text"),
        (dict(inputs=[[3, 4, 1], [5, 1]]), "different lengths; pad them"),
        (dict(rng=jnp.zeros((3, 2), jnp.uint32)), "per-row keys"),
    ],
)
def test_bad_input_raises_before_compiling(t5_pair, no_compile, change, match):
    target, draft = t5_pair
    kwargs = dict(rng=0, gamma=3, max_decode_length=8)
    inputs = change.pop("inputs", np.array([[3, 4, 1], [5, 1, 0]]))
    kwargs.update(change)
    with pytest.raises(ValueError, match=match):
        speculative_sample(target, draft, inputs, **kwargs)
    if "gamma" not in change:
        kwargs.pop("gamma")
        with pytest.raises(ValueError, match=match):
            temperature_sample(target, inputs, **kwargs)


def test_vocabulary_mismatch_raises(t5_pair, no_compile):
    target, _ = t5_pair
    other = T5Model(_t5_config(vocab=20), target.params)  # the vocabulary check comes first
    with pytest.raises(ValueError, match=r"draft vocabulary \(20 tokens\) differs from the target's \(16\)"):
        speculative_sample(target, other, np.array([[3, 1]]), rng=0, gamma=2, max_decode_length=4)


def test_truncate_cuts_long_inputs_and_keeps_eos(t5_pair):
    target, draft = t5_pair
    long = np.array([[3, 4, 5, 6, 7, 8, 1], [3, 4, 1, 0, 0, 0, 0]])
    short = np.array([[3, 4, 5, 1], [3, 4, 1, 0]])
    a = speculative_sample(target, draft, long, rng=0, gamma=2, max_decode_length=5, max_input_length=4, truncate=True)
    b = speculative_sample(target, draft, short, rng=0, gamma=2, max_decode_length=5)
    np.testing.assert_array_equal(a.sequences, b.sequences)


# ----------------------------------------------------------------------------------------------------------
# The compiled program: one top-level while loop, no host callbacks


def _entry_computation(hlo_text):
    start = hlo_text.index("\nENTRY ")
    end = hlo_text.index("\n}\n", start)
    return hlo_text[start:end]


def _decode_loops(entry):
    """Top-level while loops of the entry computation, without XLA:CPU's rolled threefry rounds (the PRNG's
    own 5-round loop when the per-row keys are folded in the program)."""
    return [line for line in entry.splitlines() if re.search(r" while\(", line) and "threefry" not in line]


def _callback_targets(hlo_text):
    return [t for t in re.findall(r'custom_call_target="([^"]*)"', hlo_text) if "callback" in t.lower()]


def test_speculative_sample_is_one_xla_while_loop_without_callbacks(t5_pair, t5_inputs):
    target, draft = t5_pair
    lowered = lower_speculative_sample(
        target, draft, t5_inputs, rng=0, gamma=GAMMA, max_decode_length=MAX_LEN, top_k=5, top_p=0.9
    )
    compiled = lowered.compile().as_text()
    entry = _entry_computation(compiled)
    assert len(_decode_loops(entry)) == 1, entry
    assert not re.search(r" custom-call\(", entry)
    assert not _callback_targets(compiled)
    stablehlo = lowered.as_text()
    assert not re.search(r"stablehlo\.(infeed|outfeed|send|recv)\b", stablehlo)
    assert not re.search(r"stablehlo\.custom_call @\w*callback", stablehlo)
    # The gamma - 1 draft steps are a loop nested in the body: more whiles in the module than at the top.
    assert len(re.findall(r" while\(", compiled)) > 1


def test_temperature_sample_is_one_xla_while_loop(t5_pair, t5_inputs):
    target, _ = t5_pair
    lowered = lower_temperature_sample(target, t5_inputs, rng=0, max_decode_length=MAX_LEN)
    compiled = lowered.compile().as_text()
    assert len(_decode_loops(_entry_computation(compiled))) == 1
    assert not _callback_targets(compiled)


# ----------------------------------------------------------------------------------------------------------
# 6. A JAX library: traceable, per-row sampling arrays, the paper's alpha


def test_speculative_sample_inside_jit_with_traced_tokens_keys_and_per_row_sampling(t5_pair, t5_inputs):
    """t5x style: jit over the core with traced tokens, key and per-row temperature / top-k / top-p; rows at
    temperature 0 equal greedy temperature_sample; five temperature vectors compile one program."""
    target, draft = t5_pair
    fn = jax.jit(
        lambda x, key, t, k, p: speculative_sample(
            target, draft, x, rng=key, gamma=GAMMA, max_decode_length=MAX_LEN, temperature=t, top_k=k, top_p=p
        )
    )
    greedy = temperature_sample(target, t5_inputs, rng=0, max_decode_length=MAX_LEN, temperature=0)
    rng = np.random.default_rng(0)
    for trial in range(5):
        t = rng.uniform(0.5, 1.5, B).astype(np.float32)
        t[::4] = 0.0  # every fourth row greedy, beside sampled rows
        k = rng.integers(0, 6, B).astype(np.int32)
        p = rng.uniform(0.5, 1.0, B).astype(np.float32)
        out = fn(jnp.asarray(t5_inputs), jax.random.PRNGKey(trial), t, k, p)
        assert isinstance(out, DecodeResult) and isinstance(out.sequences, jax.Array)
        np.testing.assert_array_equal(np.asarray(out.sequences)[::4], greedy.sequences[::4])
        _check_well_formed(jax.device_get(out), MAX_LEN)
    assert fn._cache_size() == 1  # one trace and compilation for five temperature vectors

    # Eagerly too: new temperature values reuse the compiled program (counted, not timed).
    before = decoding.loop._speculative_jit._cache_size()
    for t in (0.3, np.float32(0.5), np.float64(0.9), 1, jnp.float32(1.7)):
        speculative_sample(
            target,
            draft,
            t5_inputs,
            rng=1,
            gamma=GAMMA,
            max_decode_length=MAX_LEN,
            temperature=t,
            top_k=np.int64(5),
            top_p=np.float32(0.95),
        )
    assert decoding.loop._speculative_jit._cache_size() - before <= 1


def test_make_jaxpr_and_rng_none(t5_pair, t5_inputs):
    target, draft = t5_pair
    jaxpr = jax.make_jaxpr(lambda x: temperature_sample(target, x, max_decode_length=4, temperature=0))(
        jnp.asarray(t5_inputs)
    )
    assert "while" in str(jaxpr)
    a = speculative_sample(target, draft, t5_inputs, rng=None, gamma=2, max_decode_length=6, temperature=0.0)
    b = speculative_sample(
        target, draft, t5_inputs, rng=jax.random.PRNGKey(0), gamma=2, max_decode_length=6, temperature=0.0
    )
    np.testing.assert_array_equal(a.sequences, b.sequences)


@pytest.mark.parametrize("warp", [dict(temperature=0.0), dict(temperature=0.7, top_k=4), dict(temperature=1.0)])
def test_self_draft_alpha_is_one(t5_pair, t5_inputs, warp):
    """A draft equal to the target: beta = sum min(p, q) = 1 at every verified position (to float32
    rounding between the one-token and window computations of the same model)."""
    target, _ = t5_pair
    r = speculative_sample(target, target, t5_inputs, rng=3, gamma=GAMMA, max_decode_length=MAX_LEN, **warp)
    assert r.acceptance_rate == pytest.approx(1.0, abs=1e-5)
    assert r.accepted_fraction == 1.0 and np.all(r.num_verified == r.num_draft_tokens)


MIXED_ROWS = [  # (temperature, top_k, top_p) per distinct input row
    (1.0, 0, 1.0),
    (0.7, 3, 1.0),
    (1.0, 0, 0.8),
    (1.3, 4, 0.9),
    (0.0, 0, 1.0),
]


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [2, 4])
def test_mixed_sampling_rows_each_match_their_own_distribution(tiny_pair, gamma):
    """One batch whose rows have different temperature / top-k / top-p (and one greedy row): each row's
    ~20k samples against its own exact warped sequence distribution, chi-square at significance 0.001."""
    target, draft = tiny_pair
    max_len, rows = 4, len(MIXED_ROWS)
    inputs = _inputs(np.random.default_rng(11), rows, 5, 6)
    t, k, p = (np.array(c) for c in zip(*MIXED_ROWS))
    per_chunk = 4_001
    observed = [dict() for _ in range(rows)]
    for c in range(5):
        r = speculative_sample(
            target,
            draft,
            np.tile(inputs, (per_chunk, 1)),
            rng=jax.random.PRNGKey(77 + c),
            gamma=gamma,
            max_decode_length=max_len,
            temperature=np.tile(t, per_chunk),
            top_k=np.tile(k, per_chunk),
            top_p=np.tile(p, per_chunk),
        )
        for idx, (seq, n) in enumerate(zip(np.asarray(r.sequences), np.asarray(r.lengths))):
            key = (0, tuple(seq[:n].tolist()))
            observed[idx % rows][key] = observed[idx % rows].get(key, 0) + 1
    for i, (temp, top_k, top_p) in enumerate(MIXED_ROWS):
        dist = _exact_sequence_distribution(target, inputs[i : i + 1], Sampler(temp, top_k, top_p), max_len)
        if temp == 0:  # the greedy row: one sequence, always
            assert list(observed[i].values()) == [5 * per_chunk]
            assert dist[next(iter(observed[i]))] == pytest.approx(1.0)
            continue
        result, bins = _chi_square(observed[i], dist, {0: 5 * per_chunk})
        print(f"\nrow {i} {MIXED_ROWS[i]} gamma={gamma}: bins={bins} chi2={result.statistic:.1f} p={result.pvalue:.3f}")
        assert result.pvalue > SIGNIFICANCE


def test_bfloat16_decode_params_hand_over_a_float32_embedding_with_the_same_outputs():
    """``T5Model.decoding_model()`` of a bfloat16 T5 1.1 model on the CPU hands the loops a float32 copy of the
    token embedding (XLA:CPU has no bfloat16 gather), made once and kept; the stored parameters are untouched,
    and the decoder's logits and a speculative call's output are bit for bit those of the stored bfloat16
    table (the rows are cast back to bfloat16) and a float32 attention memory (``kv_dtype``): the decode loops'
    outputs equal those of the model as stored. Tied-embedding (T5 1.0) and float32 models, and a model traced
    inside a user's jit, are handed their own parameters."""
    from specjax.models import t5
    from specjax.models.adapter import T5Decoding

    config = T5Config(
        vocab_size=97,
        d_model=32,
        num_heads=2,
        head_dim=16,
        mlp_dim=48,
        num_encoder_layers=1,
        num_decoder_layers=2,
        name="tiny",
    )
    model = T5Model.random(config, seed=3).astype("bfloat16")
    fns, params = model.decoding_model()
    assert params["token_embedder"]["embedding"].dtype == jnp.float32
    assert model.params["token_embedder"]["embedding"].dtype == jnp.bfloat16
    assert model.decoding_model()[1] is params  # made once
    np.testing.assert_array_equal(
        np.asarray(params["token_embedder"]["embedding"]),
        np.asarray(model.params["token_embedder"]["embedding"], np.float32),
    )
    x = jnp.asarray([[5, 9, 14, 3, 1, 0]], jnp.int32)
    tokens = jnp.asarray([[0, 7, 11]], jnp.int32)

    @jax.jit
    def window_logits(p):
        encoded = t5.encode(model.config, p, x)
        cache = t5.init_cache(model.config, 1, 8)
        return t5.decode(model.config, p, encoded, tokens, cache, jnp.zeros((1,), jnp.int32))[0]

    np.testing.assert_array_equal(np.asarray(window_logits(params)), np.asarray(window_logits(model.params)))
    draft = T5Model.random(config.replace(num_decoder_layers=1), seed=4)
    kw = dict(gamma=3, max_decode_length=12, rng=jax.random.PRNGKey(1))
    for temperature in (0.0, 1.0):
        got = speculative_sample(model, draft, x, temperature=temperature, **kw)
        stored = speculative_sample((T5Decoding(model.config), model.params), draft, x, temperature=temperature, **kw)
        np.testing.assert_array_equal(np.asarray(got.sequences), np.asarray(stored.sequences))
        # The target alone too (the float32 attention memory of decoding_model() against the stored dtype).
        kw1 = dict(max_decode_length=12, rng=jax.random.PRNGKey(2), temperature=temperature)
        np.testing.assert_array_equal(
            np.asarray(temperature_sample(model, x, **kw1).sequences),
            np.asarray(temperature_sample((T5Decoding(model.config), model.params), x, **kw1).sequences),
        )
    tied = T5Model.random(config.replace(logits_via_embedding=True), seed=3).astype("bfloat16")
    assert tied.decoding_model()[1] is tied.params
    f32 = T5Model.random(config, seed=3)
    assert f32.decoding_model()[1] is f32.params
    seen = []
    jax.jit(lambda m: seen.append(m.decoding_model()[1]["token_embedder"]["embedding"].dtype) or 0)(model)
    assert seen == [jnp.bfloat16]  # traced: the parameters as they are, nothing cached from the trace

"""Tests of bulk decoding (``specjax.bulk``, ``specjax.decoding.slots``): a line's output does not depend on its
company (DESIGN.md, "Bulk decoding and company"; STYLE.md items 21-22).

The references are independent of the slots: each line decoded alone by ``temperature_sample`` /
``speculative_sample`` with its own key ``fold_in(PRNGKey(seed), line index)``, and the target's exact sequence
distribution enumerated from teacher-forced logits (``tests/test_decoding.py``'s helpers). The chi-square test
uses a fixed seed and significance 0.001.
"""

from pathlib import Path

import jax
import numpy as np
import pytest
from test_decoding import SIGNIFICANCE, _chi_square, _exact_sequence_distribution, _inputs, tiny_pair  # noqa: F401

import specjax
from specjax import speculative_sample, temperature_sample
from specjax.bulk import BulkDecoder, generate_iterable
from specjax.sampling import Sampler

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
T = 24


def _lines():
    """20 real lines of mixed lengths: 14 Multi30k test captions and 6 newstest2014 sentences under 40 tokens."""
    multi30k = (DATA / "train" / "multi30k" / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[:14]
    news = (DATA / "wmt" / "newstest2014.en").read_text(encoding="utf-8").splitlines()[:40]
    return multi30k + [line for line in news if len(line.split()) < 25][:6]


@pytest.fixture(scope="module")
def mini():
    """The shipped mini pair in float32 and 20 tokenized lines."""
    if not (DATA / "wmt" / "newstest2014.en").exists():
        pytest.skip(f"data not found under {DATA}")
    target, draft, tok = specjax.load_default_pair(size="mini", dtype="float32")
    return target, draft, [tok.encode(line) for line in _lines()]


def _alone(target, draft, rows, gamma, seed, temperature):
    """Every line decoded alone with key fold_in(PRNGKey(seed), i): a list of int32[n] token arrays. Each row is
    padded to 64 tokens (one program; the width does not change a row's output)."""
    out = []
    for i, row in enumerate(rows):
        x = np.zeros((1, 64), np.int32)
        x[0, : len(row)] = row
        key = jax.random.fold_in(jax.random.PRNGKey(seed), i)[None]
        if gamma == 0:
            r = temperature_sample(target, x, rng=key, max_decode_length=T, temperature=temperature)
        else:
            r = speculative_sample(target, draft, x, rng=key, gamma=gamma, max_decode_length=T, temperature=temperature)
        out.append(np.asarray(r.sequences[0, : int(r.lengths[0])]))
    return out


@pytest.mark.parametrize("gamma", [0, 3])
def test_greedy_bulk_output_equals_each_line_decoded_alone(mini, gamma):
    """Temperature 0, float32: each of 20 lines through 4 slots (refilled, a read-ahead of 2 batches) equals the
    line decoded alone, token for token; results come back in input order."""
    target, draft, rows = mini
    bulk = BulkDecoder(target, draft if gamma else None, batch_size=4, gamma=gamma, max_decode_length=T, read_ahead=2)
    got = list(bulk.generate(rows, temperature=0.0, rng=0))
    assert [r.index for r in got] == list(range(len(rows)))
    expected = _alone(target, draft, rows, gamma, 0, 0.0)
    for i, (r, e) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(r.tokens, e, err_msg=f"line {i}")
    assert bulk.stats.lines == len(rows) and bulk.stats.tokens == sum(len(e) for e in expected)
    assert bulk.stats.runs > len(rows) // 4  # the slots were refilled, not run once per static batch


def test_sampled_bulk_output_depends_only_on_the_seed_and_the_line(mini):
    """Temperature 1, γ 3, float32: 2 slots with a read-ahead of 1 batch, 4 slots with 3, and each line alone with
    key fold_in(seed, i) give the same tokens; a run resumed at line 7 gives lines 7.. unchanged."""
    target, draft, rows = mini
    rows = rows[:12]
    runs = []
    for slots, ahead in ((2, 1), (4, 3)):
        bulk = BulkDecoder(target, draft, batch_size=slots, gamma=3, max_decode_length=T, read_ahead=ahead)
        runs.append([r.tokens for r in bulk.generate(rows, temperature=1.0, rng=5)])
    expected = _alone(target, draft, rows, 3, 5, 1.0)
    for i, e in enumerate(expected):
        np.testing.assert_array_equal(runs[0][i], e, err_msg=f"line {i}, 2 slots")
        np.testing.assert_array_equal(runs[1][i], e, err_msg=f"line {i}, 4 slots")
    resumed = generate_iterable(
        target, draft, rows[7:], batch_size=2, gamma=3, max_decode_length=T, temperature=1.0, rng=5, start_index=7
    )
    got = list(resumed)
    assert [r.index for r in got] == list(range(7, 12))
    for r in got:
        np.testing.assert_array_equal(r.tokens, expected[r.index], err_msg=f"line {r.index}, resumed")


def test_bulk_samples_have_the_targets_distribution(tiny_pair):  # noqa: F811
    """Tiny random T5 pair (vocabulary 6), γ 2, temperature 1, 16 slots: 6,000 lines (3 inputs repeated, each line
    its own key) against the target's exact sequence distribution, chi-square at significance 0.001."""
    target, draft = tiny_pair
    max_len, per_input = 3, 2000
    inputs = _inputs(np.random.default_rng(3), 3, 5, 6)
    dist = _exact_sequence_distribution(target, inputs, Sampler(temperature=1.0), max_len)
    rows = [list(inputs[i % 3][inputs[i % 3] != 0]) for i in range(3 * per_input)]
    bulk = BulkDecoder(target, draft, batch_size=16, gamma=2, max_decode_length=max_len, refill=8)
    observed = {}
    for r in bulk.generate(rows, temperature=1.0, rng=11):
        key = (r.index % 3, tuple(int(t) for t in r.tokens))
        observed[key] = observed.get(key, 0) + 1
    result, bins = _chi_square(observed, dist, dict.fromkeys(range(3), per_input))
    print(f"\nbulk: bins={bins} chi2={result.statistic:.1f} p={result.pvalue:.3f} alpha={bulk.stats.alpha:.3f}")
    assert 0.01 < bulk.stats.alpha < 0.99  # both acceptance and rejection happen
    assert result.pvalue > SIGNIFICANCE


def test_bad_inputs_are_one_line_errors(tiny_pair):  # noqa: F811
    target, draft = tiny_pair
    bulk = BulkDecoder(target, draft, batch_size=2, gamma=2, max_decode_length=3, max_input_length=4)
    cases = [
        ([[2, 1], []], "input 1 is empty"),
        ([[2, 9, 1]], "input 0 holds ids outside the vocabulary"),
        ([[2, 3, 4, 5, 1]], "more than max_input_length=4; pass truncate=True"),
    ]
    for rows, message in cases:
        with pytest.raises(ValueError, match=message):
            list(bulk.generate(rows, temperature=0.0))
    cut = BulkDecoder(target, draft, batch_size=2, gamma=2, max_decode_length=3, max_input_length=4, truncate=True)
    assert len(list(cut.generate([[2, 3, 4, 5, 1]], temperature=0.0))) == 1
    with pytest.raises(ValueError, match="needs a draft"):
        BulkDecoder(target, None, gamma=2, max_decode_length=3)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        BulkDecoder(target, draft, batch_size=0, gamma=2, max_decode_length=3)


def test_a_refused_input_comes_after_every_line_before_it(tiny_pair):  # noqa: F811
    """2 slots, a read-ahead of 1 batch, an id outside the vocabulary at line 9: lines 0-8 (8 read in the same
    window as 9, 7 still in a slot when it is read) are all yielded, in order and equal to a run on the nine good
    lines alone, and then the error naming line 9 is raised."""
    target, draft = tiny_pair
    rows = [list(r[r != 0]) for r in _inputs(np.random.default_rng(3), 9, 5, 6)]
    settings = dict(batch_size=2, read_ahead=1, gamma=2, max_decode_length=4)
    expected = [r.tokens for r in BulkDecoder(target, draft, **settings).generate(rows, temperature=0.0)]
    got = []
    with pytest.raises(ValueError, match="input 9 holds ids outside the vocabulary"):
        for r in BulkDecoder(target, draft, **settings).generate(rows + [[2, 9, 1], rows[0]], temperature=0.0):
            got.append(r)
    assert [r.index for r in got] == list(range(9))
    for r, e in zip(got, expected):
        np.testing.assert_array_equal(r.tokens, e)


def test_gamma_auto_picks_the_kind_from_costs(tiny_pair):  # noqa: F811
    """γ auto with given costs: a cheap draft and α near 1 pick a speculative γ; a draft as dear as the target picks
    the target alone (0), and the slots then hold no draft state. Greedy outputs are the target's either way."""
    from specjax.decoder import Costs

    target, draft = tiny_pair
    rows = [list(r[r != 0]) for r in _inputs(np.random.default_rng(0), 6, 5, 6)]
    cheap = Costs(step=(1.0,) * 4, draft=(0.0,) + (0.01,) * 3, encode=(0.1,) * 4)
    dear = Costs(step=(1.0,) + (3.0,) * 3, draft=(0.0,) + (1.0,) * 3, encode=(0.1,) * 4)
    reference = generate_iterable(target, None, rows, batch_size=2, gamma=0, max_decode_length=4, temperature=0.0)
    expected = [r.tokens for r in reference]
    for costs, spec in ((cheap, True), (dear, False)):
        bulk = BulkDecoder(
            target,
            draft,
            batch_size=2,
            gamma="auto",
            max_decode_length=4,
            candidates=(0, 1, 2, 3),
            alpha_prior=0.95,
            costs={2: costs},
            cost_cache=False,
        )
        got = [r.tokens for r in bulk.generate(rows, temperature=0.0)]
        assert (min(bulk.stats.gammas) > 0) == spec, bulk.stats.reasons
        again = [r.tokens for r in bulk.generate(rows[:3], temperature=0.0)]  # a second call on the same decoder
        for g, e in zip(got + again, expected + expected[:3]):
            np.testing.assert_array_equal(g, e)


def test_gamma_auto_falls_back_to_the_target_alone_when_alpha_is_low(tiny_pair):  # noqa: F811
    """γ auto starts speculative on an optimistic α prior (0.5: γ 1 predicted 7 % faster than the target alone) and,
    once the running α of the random pair's rows comes out low, re-chooses 0 (the target alone) for the rest of the
    run; every line is still the target's greedy decode."""
    from specjax.bulk import RECHOOSE_EVERY
    from specjax.decoder import Costs

    target, draft = tiny_pair
    rows = [list(r[r != 0]) for r in _inputs(np.random.default_rng(1), 40, 5, 6)]
    costs = Costs(step=(1.0,) * 4, draft=(0.0,) + (0.4,) * 3, encode=(0.0,) * 4)
    bulk = BulkDecoder(
        target,
        draft,
        batch_size=2,
        gamma="auto",
        max_decode_length=8,
        candidates=(0, 1, 2, 3),
        alpha_prior=0.5,
        costs={2: costs},
        cost_cache=False,
    )
    got = [r.tokens for r in bulk.generate(rows, temperature=0.0)]
    assert bulk.stats.runs > 2 * RECHOOSE_EVERY
    assert bulk.stats.alpha < 0.3, bulk.stats.alpha
    assert bulk.stats.gammas.get(1, 0) > 0 and bulk.stats.gammas.get(0, 0) > 0, (bulk.stats.gammas, bulk.stats.reasons)
    expected = [
        r.tokens
        for r in generate_iterable(target, None, rows, batch_size=2, gamma=0, max_decode_length=8, temperature=0.0)
    ]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_bench_batch_sizes_above_one_measure_the_bulk_path(mini):
    """``specjax bench`` at a batch size > 1 measures bulk decodes (``measure_bulk_pair``): greedy, γ 3 through 4
    slots against the target alone through the same slots; both sides' outputs equal each line decoded alone, the
    target alone makes one target call per token, and the speculative side's counts are its lines' own."""
    from specjax.bench import BulkPairMeasurement, measure_bulk_pair

    target, draft, rows = mini
    rows = rows[:10]
    m = measure_bulk_pair(target, draft, rows, gamma=3, batch_size=4, temperature=0.0, max_decode_length=T)
    assert isinstance(m, BulkPairMeasurement) and m.num_inputs == len(rows)
    expected = _alone(target, draft, rows, 0, 0, 0.0)
    for which in ("spec", "base"):
        for i, (got, e) in enumerate(zip(m.sequences(which), expected)):
            np.testing.assert_array_equal(got, e, err_msg=f"{which} line {i}")
    assert m.output_tokens == m.base_output_tokens == sum(len(e) for e in expected)
    base_calls = int(m.base[0].num_target_calls.sum())
    assert base_calls == m.base_output_tokens  # the target alone: one call per token
    spec_calls = int(m.spec[0].num_target_calls.sum())
    assert m.tokens_per_target_call == pytest.approx(m.output_tokens / spec_calls)
    assert 1.0 < m.tokens_per_target_call <= 4.0  # γ 3: at most γ + 1 tokens per call, and the pair agrees often
    alpha = m.acceptance_rate
    assert 0.0 < alpha <= 1.0
    assert 0 < m.spec_iterations <= spec_calls
    assert m.spec_seconds > 0 and m.base_seconds > 0


def test_inserted_rows_are_encoded_as_each_row_alone(mini):
    """``slots.encode_alone``: the encoder output of a row inserted with 7 others is, bit for bit, the row's
    encoder output as a batch of one (a batched encode may round a row differently; DESIGN.md, "Bulk decoding
    and company")."""
    from specjax.decoding.model import as_decoding_model
    from specjax.decoding.slots import encode_alone

    target, _, rows = mini
    fns, params = as_decoding_model(target, "target")
    x = np.zeros((8, 64), np.int32)
    for j, row in enumerate(rows[12:20]):
        x[j, : len(row)] = row
    got = jax.jit(lambda p, t: encode_alone(fns, p, t))(params, x)
    for j in (0, 5):
        alone = jax.jit(fns.encode)(params, x[j : j + 1])
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(alone)):
            np.testing.assert_array_equal(np.asarray(a)[j], np.asarray(b)[0], err_msg=f"row {j}")

"""Tests of ``gamma="auto"`` (``specjax.Decoder``) and the machine-dependent defaults (``specjax.hardware``).

The choice of γ never changes what is sampled: greedy output equals the target alone on 96 Multi30k lines while
γ changes between calls, and samples at temperature 1 match the target's exact sequence distribution
(enumeration on a tiny vocabulary; chi-square at significance 0.001, fixed seeds) while γ changes between calls.
The choice follows its model (the argmax of the paper's formula over measured costs); the cost cache round-trips
and is keyed by the machine; a CPU without native bfloat16 dots gets the float32 path.
"""

import json

import jax
import numpy as np
import pytest
from test_decoding import SIGNIFICANCE, _chi_square, _exact_sequence_distribution, _inputs, _perturbed, tiny_pair

import specjax
from specjax import bench, hardware, temperature_sample
from specjax.decoder import Costs, Decoder, expected_tokens
from specjax.sampling import Sampler


def _flat_costs(step, window, draft, encode=0.0, gammas=8) -> Costs:
    """Costs with a one-token target step ``step``, every window ``window`` and draft step ``draft`` (seconds)."""
    return Costs((step,) + (window,) * gammas, (0.0,) + (draft,) * gammas, (encode,) + (encode + encode / 10,) * gammas)


# ----------------------------------------------------------------------------------------------------------
# Exactness while γ changes between calls


def test_auto_greedy_equals_target_alone_on_96_multi30k_lines_while_gamma_changes(data_dir):
    """Mini pair in float32: 6 batches of 16 Multi30k test lines through one Decoder whose γ is forced to
    0 and 5 in turn (two programs: compile time bounds this test); every batch equals greedy
    ``temperature_sample`` token for token."""
    target, draft, tok = specjax.load_default_pair(size="mini", dtype="float32")
    lines = (data_dir / "train" / "multi30k" / "test_2016_flickr.en").read_text().splitlines()[:96]
    batches = bench.pad_batches([tok.encode(line) for line in lines], batch_size=16)
    decoder = Decoder(target, draft, gamma="auto", max_decode_length=48, cost_cache=False)
    schedule = (0, 5)
    for j, x in enumerate(batches):
        gamma = schedule[j % len(schedule)]
        r = decoder(x, rng=jax.random.PRNGKey(j), temperature=0.0, gamma=gamma)
        assert decoder.last_choice.gamma == gamma
        base = temperature_sample(target, x, rng=jax.random.PRNGKey(j), max_decode_length=48, temperature=0.0)
        np.testing.assert_array_equal(np.asarray(r.sequences), np.asarray(base.sequences))
        np.testing.assert_array_equal(np.asarray(r.lengths), np.asarray(base.lengths))
    assert [h[0] for h in decoder.history] == [schedule[j % 2] for j in range(len(batches))]
    # α was learned from the speculative calls only (the target alone verifies nothing): between 0 and 1, away
    # from the prior after 3 calls of 16 rows.
    assert 0.3 < decoder.alpha(1.0) < 0.95


def test_auto_samples_match_the_target_distribution_while_gamma_changes(tiny_pair):
    """Tiny T5 pair (vocabulary 6, 4 tokens): 6 calls of 5,000 rows at temperature 1 through one Decoder, γ
    changed by the choice itself between calls (its cost table is replaced before each call so that a
    different γ — 0, 1, 3, 6 — is the argmax); the 30,000 samples against the target's exact sequence
    distribution, chi-square at significance 0.001."""
    target = tiny_pair[0]
    draft = _perturbed(target, 0.3, seed=2)  # a close draft: α well inside (0, 1)
    max_len, rows = 4, 5_000
    inputs = _inputs(np.random.default_rng(5), 1, 5, 6)
    dist = _exact_sequence_distribution(target, inputs, Sampler(temperature=1.0), max_len)
    decoder = Decoder(target, draft, gamma="auto", max_decode_length=max_len, cost_cache=False)

    def only(g):  # costs whose argmax is γ g at any α in (0, 1): its window is the one cheap program
        window = tuple(1.0 if i == g else 100.0 if i == 0 else 9.0 for i in range(9))
        return Costs(window, (0.0,) + (1e-4,) * 8, (0.0,) * 9)

    tables = {0: _flat_costs(1.0, 1.0, 1.0)}  # γ 0: the draft costs as much as the target, no draft
    tables.update({g: only(g) for g in (1, 3, 6)})
    observed, ran = {}, []
    for c, gamma in enumerate((0, 1, 3, 6, 3, 1)):
        decoder.costs[rows] = tables[gamma]
        decoder._factors.clear()  # factors of real calls against these made-up seconds would be meaningless
        r = decoder(np.tile(inputs, (rows, 1)), rng=jax.random.PRNGKey(500 + c), temperature=1.0)
        ran.append(decoder.last_choice.gamma)
        print(decoder.last_choice.describe())
        for seq, n in zip(np.asarray(r.sequences), np.asarray(r.lengths)):
            key = (0, tuple(seq[:n].tolist()))
            observed[key] = observed.get(key, 0) + 1
    assert ran == [0, 1, 3, 6, 3, 1]
    assert 0.05 < decoder.alpha(0.0) < 0.95  # both acceptance and rejection exercised
    result, bins = _chi_square(observed, dist, {0: 6 * rows})
    print(f"\nauto γ {ran}: bins={bins} chi2={result.statistic:.1f} p={result.pvalue:.3f}")
    assert result.pvalue > SIGNIFICANCE


# ----------------------------------------------------------------------------------------------------------
# The choice follows its model


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.8, 0.95])
def test_choice_is_the_argmax_of_the_formula(tiny_pair, alpha):
    """Given costs and α, the choice is the γ maximising tokens / (encode + iterations(α, γ) · iteration(γ)),
    with the expected iterations of a batch of 4 rows of 20 tokens (the decoder's prior: max_decode_length / 2)
    estimated here independently by Monte Carlo (Leviathan et al. 2023, §3.1's i.i.d. acceptance; 40,000 simulated
    calls, so the argmax is checked where the top two γ differ by more than the simulation's error)."""
    target, draft = tiny_pair
    window = [0.010, 0.012, 0.013, 0.015, 0.018, 0.020, 0.024, 0.027, 0.030]  # seconds, window of γ + 1 tokens
    costs = Costs(tuple(window), (0.0,) + (0.0015,) * 8, (0.002,) + (0.0025,) * 8)
    decoder = Decoder(target, draft, max_decode_length=40, alpha_prior=alpha, cost_cache=False, costs={4: costs})
    choice = decoder.choose(np.ones((4, 5), np.int32), temperature=0.0)
    lengths = np.full(4, 20)  # the decoder's prior for a call's rows: max_decode_length / 2 tokens each

    def tokens_per_second(g):
        return 80 / (costs.encode[g] + _monte_carlo_iterations(lengths, alpha, g) * (window[g] + g * costs.draft[g]))

    by_gamma = {g: tokens_per_second(g) for g in range(9)}
    for g in range(9):
        assert choice.predicted[g] == pytest.approx(by_gamma[g], rel=0.01)  # the simulation's error: < 0.5 %
        assert expected_tokens(alpha, g) == pytest.approx(1 if g == 0 else (1 - alpha ** (g + 1)) / (1 - alpha))
    assert choice.gamma == max(choice.predicted, key=choice.predicted.get)
    runner_up, best = sorted(by_gamma.values())[-2:]
    if runner_up < best * 0.99:  # apart by more than the simulation's error
        assert choice.gamma == max(by_gamma, key=by_gamma.get)
    assert choice.alpha == pytest.approx(alpha)
    assert "auto" in choice.reason and str(choice.gamma) in choice.reason


def test_no_draft_when_the_draft_costs_as_much_as_the_target(tiny_pair):
    """A draft step as dear as a target step: γ 0 (the target alone) at any α below 1."""
    target, draft = tiny_pair
    for alpha in (0.5, 0.9, 0.99):
        decoder = Decoder(
            target, draft, max_decode_length=40, alpha_prior=alpha, cost_cache=False, costs={1: _flat_costs(1, 1, 1)}
        )
        assert decoder.choose(np.ones((1, 5), np.int32), 0.0).gamma == 0


def _monte_carlo_iterations(lengths, alpha: float, gamma: int, calls: int = 40_000) -> float:
    """Mean loop iterations of simulated calls: per row and iteration, the accepted count A is the number of
    leading successes in γ Bernoulli(α) trials, the iteration emits A + 1 tokens, and a row of L tokens is done
    once it has emitted L; the call ends with its slowest row. γ 0: one token per iteration."""
    lengths = np.asarray(lengths)
    if gamma == 0:
        return float(lengths.max())
    rng = np.random.default_rng(11)
    trials = rng.random((calls, lengths.size, int(lengths.max()), gamma)) < alpha  # [calls, b, iteration, γ]
    accepted = np.argmin(np.concatenate([trials, np.zeros(trials.shape[:-1] + (1,), bool)], -1), -1)
    emitted = np.cumsum(accepted + 1, -1)
    return float(np.mean(np.max(np.sum(emitted < lengths[None, :, None], -1) + 1, -1)))


@pytest.mark.parametrize("alpha,gamma,lengths", [(0.8, 5, [20]), (0.6, 3, [20, 15, 25, 12]), (0.9, 8, [7, 31])])
def test_expected_iterations_match_a_monte_carlo_of_the_loop(alpha, gamma, lengths):
    """``expected_iterations`` (exact, by convolution) equals a Monte Carlo of the loop within 1 %."""
    from specjax.decoder import expected_iterations

    assert expected_iterations(lengths, alpha, gamma) == pytest.approx(
        _monte_carlo_iterations(lengths, alpha, gamma), rel=0.01
    )
    assert expected_iterations(lengths, alpha, 0) == max(lengths)
    assert expected_iterations(lengths, 1.0, gamma) == pytest.approx(max(-(-np.asarray(lengths) // (gamma + 1))))


def _finished(b: int, length: int, alpha: float, iterations: int = 6):
    """A stand-in for a finished call's ``DecodeResult`` (what ``Decoder._learn`` reads): b rows of ``length``
    tokens, 10 verified positions each at acceptance rate ``alpha``, ``iterations`` target calls each."""
    import types

    return types.SimpleNamespace(
        beta_sum=np.full((b,), 10 * alpha),
        num_verified=np.full((b,), 10.0),
        lengths=np.full((b,), length),
        num_target_calls=np.full((b,), iterations),
    )


def _teach(decoder, x, gamma: int, slowdown: float, alpha: float = 0.8, length: int = 20) -> None:
    """Feeds the decoder one call at ``gamma`` that took ``slowdown`` x the cost model's seconds (its program
    already compiled: the first call of a program teaches no time)."""
    from specjax.decoder import _model_seconds

    iterations = length if gamma == 0 else 6  # what _finished reports: the loop's iterations
    seconds = slowdown * _model_seconds(decoder.costs[x.shape[0]], gamma, iterations)
    for _ in range(2):
        decoder._learn(x, 0.0, gamma, _finished(x.shape[0], length, alpha), seconds)


def test_a_busy_moment_does_not_drive_auto_to_the_program_not_yet_timed(tiny_pair):
    """Calls of the speculative γ that ran 3x slower than the cost model (the machine busy: every program
    slower alike) leave the choice on that γ: the target alone, not run yet, borrows the same factor; once the
    target alone has run at the model's speed, the same evidence does move the choice to it."""
    target, draft = tiny_pair
    costs = _flat_costs(1.0, 1.1, 0.05)  # a cheap draft: speculative clearly ahead on the model
    decoder = Decoder(target, draft, max_decode_length=40, alpha_prior=0.8, cost_cache=False, costs={1: costs})
    x = np.ones((1, 5), np.int32)
    first = decoder.choose(x, 0.0)
    assert first.gamma >= 1
    for _ in range(4):
        _teach(decoder, x, first.gamma, slowdown=3.0)
    assert decoder.factor(1, first.gamma) == pytest.approx(3.0)
    assert decoder.factor(1, 0) == pytest.approx(3.0)  # borrowed
    assert decoder.choose(x, 0.0).gamma == first.gamma
    for _ in range(4):
        _teach(decoder, x, 0, slowdown=1.0)
    assert decoder.factor(1, 0) == pytest.approx(1.0)
    assert decoder.choose(x, 0.0).gamma == 0  # 3x on speculative calls against 1x: the target alone wins


def test_auto_explores_the_other_kind_every_explore_every_calls(tiny_pair):
    """With the target alone predicted within EXPLORE_WITHIN of the best speculative γ and not run for
    EXPLORE_EVERY calls, auto runs it once (and says so), then returns to the best γ."""
    from specjax.decoder import EXPLORE_EVERY, EXPLORE_WITHIN

    target, draft = tiny_pair
    costs = _flat_costs(1.0, 1.0, 0.15)  # at α 0.4: γ 1 predicted about 1.2x the target alone
    decoder = Decoder(target, draft, max_decode_length=40, alpha_prior=0.4, cost_cache=False, costs={1: costs})
    x = np.ones((1, 5), np.int32)
    predicted = decoder.choose(x, 0.0).predicted
    best = max(predicted, key=predicted.get)
    assert best >= 1 and EXPLORE_WITHIN * predicted[best] <= predicted[0] < predicted[best]
    ran = []
    for _ in range(EXPLORE_EVERY + 2):
        choice = decoder.choose(x, 0.0)
        ran.append(choice.gamma)
        decoder._note_run(1, choice, forced=False)  # what a call books (no decode needed for the choice)
    assert ran[:EXPLORE_EVERY] == [best] * EXPLORE_EVERY
    assert ran[EXPLORE_EVERY] == 0 and ran[EXPLORE_EVERY + 1] == best


def test_alpha_is_learned_separately_for_greedy_and_sampled_rows(tiny_pair):
    """α starts at the prior (a pair's recorded one, else 0.6) and moves with each call's rows by temperature:
    greedy rows move the greedy α only."""
    target, draft = tiny_pair
    decoder = Decoder(target, draft, gamma=3, max_decode_length=4, cost_cache=False)
    assert decoder.alpha_prior == (0.6, 0.6)
    x = np.tile(_inputs(np.random.default_rng(3), 1, 5, 6), (64, 1))
    r = decoder(x, temperature=0.0)
    greedy = float(np.sum(r.beta_sum) / np.sum(r.num_verified))
    assert decoder.alpha(0.0) == pytest.approx(0.6)  # sampled rows: untouched
    assert min(greedy, 0.6) <= decoder.alpha(1.0) <= max(greedy, 0.6)
    assert decoder.last_choice.reason == "fixed γ 3"


def test_shipped_pairs_recorded_alpha_is_the_prior():
    target, draft, _ = specjax.load_default_pair("distilled", size="mini", dtype="float32")
    assert Decoder(target, draft, max_decode_length=8, cost_cache=False).alpha_prior == (0.670, 0.592)
    _, reference, _ = specjax.load_default_pair("reference", size="mini", dtype="float32")
    assert Decoder(target, reference, max_decode_length=8, cost_cache=False).alpha_prior == (0.552, 0.531)


def test_gamma_zero_is_the_target_alone_and_bad_gammas_are_refused(tiny_pair):
    target, draft = tiny_pair
    x = np.tile(_inputs(np.random.default_rng(4), 1, 5, 6), (3, 1))
    r = Decoder(target, draft, gamma=0, max_decode_length=4, cost_cache=False)(x, temperature=0.0)
    base = temperature_sample(target, x, max_decode_length=4, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(r.sequences), np.asarray(base.sequences))
    assert int(np.sum(r.num_draft_tokens)) == 0
    with pytest.raises(ValueError, match="'auto' or an int >= 0"):
        Decoder(target, draft, gamma=-1, max_decode_length=4)
    with pytest.raises(ValueError, match="needs a draft"):
        Decoder(target, None, gamma=3, max_decode_length=4)
    assert Decoder(target, None, max_decode_length=4, cost_cache=False).choose(x, 0.0).gamma == 0


# ----------------------------------------------------------------------------------------------------------
# The cost cache and the machine


def test_cost_cache_round_trips_and_is_keyed_by_the_machine(tmp_path, monkeypatch, tiny_pair):
    """Costs measured once are read back from ``$SPECJAX_CACHE_DIR/costs.json`` by a new Decoder (nothing
    measured again); another CPU (other flags) gets another key."""
    monkeypatch.setenv("SPECJAX_CACHE_DIR", str(tmp_path))
    target, draft = tiny_pair
    x = np.tile(_inputs(np.random.default_rng(4), 1, 5, 6), (2, 1))
    first = Decoder(target, draft, max_decode_length=4, candidates=(0, 1, 2))
    costs = first.costs_for(x)
    assert costs.max_gamma == 2 and all(t > 0 for t in costs.step) and costs.draft[0] == 0.0
    stored = json.loads((tmp_path / "costs.json").read_text())
    assert len(stored) == 1 and Costs.from_json(next(iter(stored.values()))) == costs

    import specjax.decoder as decoder_module

    def no_measuring(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(decoder_module, "measure_costs", no_measuring)
    second = Decoder(target, draft, max_decode_length=4, candidates=(0, 1, 2))
    assert second.costs_for(x) == costs
    key = second._cost_key(x)
    real = hardware.cpu_info()
    monkeypatch.setattr(hardware, "cpu_info", lambda: hardware.CpuInfo(real.model, frozenset({"avx2"}), real.cores))
    assert second._cost_key(x) != key
    with pytest.raises(AssertionError, match="measured again"):
        Decoder(target, draft, max_decode_length=4, candidates=(0, 1, 2)).costs_for(x)


def test_dtype_auto_upcasts_bfloat16_on_an_avx2_only_cpu(monkeypatch):
    """dtype "auto": bfloat16 stays bfloat16 on a CPU with avx512_bf16 or amx_bf16 (the pair's preferred
    dtypes); on an AVX2-only CPU both models load in float32; explicit dtypes win; TPU/GPU keep bfloat16."""
    from specjax import defaults

    def cpu(flags):
        monkeypatch.setattr(hardware, "cpu_info", lambda: hardware.CpuInfo("Test CPU", frozenset(flags), 2))

    cpu({"avx2", "fma"})
    assert hardware.auto_dtypes(("bfloat16", "float32"), "cpu")[0] == ("float32", "float32")
    assert defaults.pair_dtypes("small")[:2] == ("float32", "float32")
    assert "no native bfloat16 dots" in defaults.pair_dtypes("small")[2]
    assert defaults.pair_dtypes("small", "bfloat16")[:2] == ("bfloat16", "bfloat16")
    target, draft, _ = specjax.load_default_pair(size="mini")
    assert (target.config.dtype, draft.config.dtype) == ("float32", "float32")
    for flag in hardware.BF16_DOT_FLAGS:
        cpu({"avx2", "avx512f", flag})
        assert hardware.native_bf16_dots()
        assert hardware.auto_dtypes(("bfloat16", "float32"), "cpu")[0] == ("bfloat16", "float32")
    assert defaults.pair_dtypes("small")[:2] == ("bfloat16", "float32")
    assert defaults.pair_dtypes("mini")[:2] == ("float32", "float32")  # its decoder fits the L3 cache
    assert hardware.auto_dtypes(("bfloat16", "float32"), "tpu")[0] == ("bfloat16", "bfloat16")
    with pytest.raises(ValueError, match="dtype must be one of"):
        defaults.pair_dtypes("small", "float64")


def test_cpu_info_reads_model_and_flags(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text(
        "processor\t: 0\nmodel name\t: Some CPU 9000\nflags\t\t: fpu avx2 AVX512F avx512_bf16\n\nprocessor\t: 1\n"
    )
    model, flags = hardware._read_cpuinfo(str(f))
    assert model == "Some CPU 9000" and {"avx2", "avx512f", "avx512_bf16"} <= flags
    info = hardware.CpuInfo(model, flags, 2)
    assert hardware.native_bf16_dots(info) and info.describe() == "Some CPU 9000, 2 cores, avx2 avx512f avx512_bf16"


def test_peer_engines_each_in_their_own_process_agree_greedy(tmp_path, tiny_pair):
    """``specjax.bench.processes``: the target alone, a Decoder at γ 2 and CTranslate2 float32, each in a fresh
    worker process on the same 3 inputs: greedy tokens agree line for line (same float32 weights); the table
    names the CPU. (Nothing timed is asserted; γ auto's worker is the same code, with a cost measurement that
    would triple this test's time.)"""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'specjax[bench]')")
    pytest.importorskip("transformers")
    from specjax import save_checkpoint
    from specjax.bench import processes

    target = tiny_pair[0]
    save_checkpoint(target, tmp_path / "target")
    save_checkpoint(_perturbed(target, 0.1, seed=3), tmp_path / "draft")
    rows = [[5, 3, 2, 1], [4, 4, 1], [2, 5, 3, 4, 1]]
    r = processes.compare_in_processes(
        str(tmp_path / "target"),
        str(tmp_path / "draft"),
        rows,
        dtype="float32",
        gammas=(2,),
        max_decode_length=4,
        batch_sizes=(2,),
        threads=(1,),
        rounds=1,
        passes=1,
        workdir=str(tmp_path / "work"),
    )
    by = {x["method"]: x for x in r["records"]}
    assert set(by) == {"specjax temperature_sample", "specjax γ=2", "ctranslate2 float32 1 thread"}
    assert all(x["identical"] == len(rows) and x["tokens"] > 0 for x in by.values())
    assert set(by["specjax γ=2"]["gammas"]) == {2}
    assert hardware.cpu_info().model in processes.format_processes(r)

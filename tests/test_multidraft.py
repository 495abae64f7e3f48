"""Multi-draft speculative sampling (``num_drafts`` = k > 1): the branch-point rule by exact enumeration, its
sampler by chi-square, the whole decode by chi-square against the tiny target's exact sequence distribution,
greedy identity, the model's branch windows against chain windows, and bad settings.

Statistical tests use fixed seeds and a chi-square test at significance 0.001 (``SIGNIFICANCE``; bins with
expected count < 5 merged). Reuses the machinery of tests/test_decoding.py and tests/test_verifiers_and_drafts.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from test_decoding import (
    SIGNIFICANCE,
    PositionTable,
    _inputs,
    _perturbed,
    _t5_config,
    tiny_pair,  # a fixture
)
from test_verifiers_and_drafts import _chi_square_run

from specjax import PromptLookupDraft, T5Model, speculative_sample, temperature_sample
from specjax.decoding.branches import draw_candidates, recursive_reject
from specjax.models import t5
from specjax.sampling import Sampler, SamplingParams

__all__ = ["tiny_pair"]

# ----------------------------------------------------------------------------------------------------------
# 1. The branch-point rule (recursive rejection sampling without replacement) by exact enumeration


def _branch_point_exact(p, q, k):
    """Exact joint law of (kept candidate j in 0..k, k = none; emitted token y) of the rule, float64[k + 1, v],
    by enumerating every ordered tuple of distinct candidates (candidate j drawn from p without the earlier
    ones, renormalised; candidates stop when p has no mass left), an independent reading of the rule."""
    v = len(p)
    joint = np.zeros((k + 1, v))

    def visit(j, taken, prob, q_j):
        rest = np.where(np.isin(np.arange(v), list(taken)), 0.0, p)
        if j == k or rest.sum() == 0:  # no candidate left: the token comes from the current residual
            joint[k] += prob * q_j
            return
        p_j = rest / rest.sum()
        excess = np.maximum(q_j - p_j, 0.0)
        q_next = excess / excess.sum() if excess.sum() > 0 else q_j
        for x in np.flatnonzero(p_j > 0):
            accept = min(1.0, q_j[x] / p_j[x])
            joint[j, x] += prob * p_j[x] * accept
            if accept < 1:
                visit(j + 1, taken | {int(x)}, prob * p_j[x] * (1 - accept), q_next)

    visit(0, frozenset(), 1.0, q)
    return joint


def _random_pair(rng, v, p_support, q_support):
    """Draft and target distributions float64[v] with the given support sizes (random positions)."""
    out = []
    for support in (p_support, q_support):
        w = np.zeros(v)
        w[rng.choice(v, support, replace=False)] = rng.gamma(0.7, size=support)
        out.append(w / w.sum())
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_branch_point_emits_the_target_distribution_exactly(k):
    """Exact enumeration: for random p and q (full support, and p or q with fewer tokens than k, as top-k /
    top-p warping makes them), the token emitted at the branch point has law q to 1e-12; with k = 1 the rule is
    Leviathan et al.'s, and more candidates never lower the chance that some draft is kept."""
    rng = np.random.default_rng(k)
    for p_support, q_support in [(6, 6), (2, 6), (6, 2), (3, 3), (1, 4)]:
        for _ in range(5):
            p, q = _random_pair(rng, 6, p_support, q_support)
            joint = _branch_point_exact(p, q, k)
            np.testing.assert_allclose(joint.sum(axis=0), q, atol=1e-12)
            kept_any = joint[:k].sum()
            single = np.minimum(p, q).sum()  # Leviathan et al. 2023: a single draft is kept with prob. Σ min(p, q)
            assert kept_any >= single - 1e-12
            if k == 1:
                assert kept_any == pytest.approx(single, abs=1e-12)


@pytest.mark.parametrize("k,warp", [(2, dict(temperature=1.0)), (4, dict(temperature=0.8, top_k=3))])
def test_candidates_and_rule_sample_the_enumerated_joint_law(k, warp):
    """``draw_candidates`` (Gumbel-top-k) and ``recursive_reject`` as the loop runs them: 200k rows of one fixed
    (p, q) pair; the (kept candidate, emitted token) counts against ``_branch_point_exact`` (chi-square,
    significance 0.001). With top-k 3 < k = 4 the fourth candidate never exists."""
    rows, v = 200_000, 6
    rng = np.random.default_rng(5)
    draft_logits = rng.normal(size=v).astype(np.float32) * 1.5
    target_logits = rng.normal(size=v).astype(np.float32) * 1.5
    sampler = Sampler(**warp)
    p = np.asarray(sampler.probs(draft_logits[None]), np.float64)[0]
    q = np.asarray(sampler.probs(target_logits[None]), np.float64)[0]
    sampling = SamplingParams.broadcast(rows, **warp)

    @jax.jit
    def run(key):
        keys = jax.random.split(key, 2 * rows).reshape(2, rows, 2)
        x, laws, valid = draw_candidates(keys[0], jnp.tile(draft_logits, (rows, 1)), sampling, k)
        kept, fallback = recursive_reject(keys[1], x, laws, valid, jnp.tile(jnp.asarray(q, jnp.float32), (rows, 1)))
        token = jnp.where(kept < k, jnp.take_along_axis(x, jnp.minimum(kept, k - 1)[:, None], axis=1)[:, 0], fallback)
        return x, valid, kept, token

    x, valid, kept, token = (np.asarray(a) for a in run(jax.random.PRNGKey(0)))
    assert np.all([len(set(r)) == k for r in x])  # distinct candidates
    if "top_k" in warp:
        assert not valid[:, 3].any() and valid[:, :3].all()
    joint = _branch_point_exact(p, q, k)
    counts = np.zeros_like(joint)
    np.add.at(counts, (kept, token), 1)
    expected = joint.ravel() * rows
    assert counts.ravel()[expected == 0].sum() == 0
    big = expected >= 5
    obs = np.append(counts.ravel()[big], counts.ravel()[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()
    result = stats.chisquare(obs, exp)
    print(f"\nk={k} {warp}: bins={len(exp)} chi2={result.statistic:.1f} p={result.pvalue:.3f}")
    assert result.pvalue > SIGNIFICANCE


def test_greedy_candidates_are_the_top_k_and_the_rule_keeps_the_argmax():
    """Temperature 0: the candidates are the draft's k largest logits (the argmax first), each a point mass,
    and the rule keeps the candidate equal to the target's argmax (none: the argmax itself is emitted)."""
    logits = jnp.asarray([[0.1, 3.0, 2.0, -1.0, 2.5], [1.0, 0.0, 0.5, 0.2, 0.3]])
    sampling = SamplingParams.broadcast(2, temperature=0.0)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    x, laws, valid = draw_candidates(keys, logits, sampling, 3)
    np.testing.assert_array_equal(x, [[1, 4, 2], [0, 2, 4]])
    np.testing.assert_array_equal(laws, jax.nn.one_hot(x, 5))
    assert bool(valid.all())
    q = jax.nn.one_hot(jnp.asarray([2, 3]), 5)  # the target's argmax: candidate 3 of row 0, none of row 1
    kept, fallback = recursive_reject(keys, x, laws, valid, q)
    np.testing.assert_array_equal(kept, [2, 3])
    assert int(fallback[1]) == 3


# ----------------------------------------------------------------------------------------------------------
# 2. The whole decode against the tiny target's exact sequence distribution

MULTI_CASES = [  # (num_drafts, verification, warping, gamma, batch): every k, rule, warping and batch covered
    (2, "token", dict(temperature=1.0), 2, 7),
    (3, "token", dict(top_p=0.8), 1, 7),
    (4, "token", dict(temperature=0.7, top_k=3), 3, 1),
    (2, "block", dict(temperature=0.7, top_k=3), 3, 7),
    (3, "block", dict(temperature=1.0), 2, 1),
    (4, "block", dict(top_p=0.8), 2, 7),
]


@pytest.mark.slow
@pytest.mark.parametrize("num_drafts,verification,warp,gamma,batch", MULTI_CASES)
def test_multi_draft_matches_target_sequence_distribution(tiny_pair, num_drafts, verification, warp, gamma, batch):
    """>= 100k multi-draft samples vs. the target's exact sequence distribution (chi-square, 0.001); ragged
    batches (7 inputs of different lengths); later branches are kept in a good share of iterations."""
    target, draft = tiny_pair
    result, bins, alpha, r = _chi_square_run(
        target, draft, warp, gamma, batch, 5000 + 10 * num_drafts, verification=verification, num_drafts=num_drafts
    )
    by_branch = r.acceptance_by_branch
    print(
        f"\nk={num_drafts} {verification} {warp} gamma={gamma} batch={batch}: bins={bins} chi2={result.statistic:.1f} "
        f"p={result.pvalue:.3f} alpha={alpha:.3f} by branch={np.round(by_branch, 3)}"
    )
    assert by_branch.shape == (num_drafts,) and by_branch[1] > 0.005  # thousands of later-branch iterations
    assert result.pvalue > SIGNIFICANCE


@pytest.mark.slow
def test_multi_draft_mixed_rows_each_match_their_own_distribution(tiny_pair):
    """One batch of rows with different warpings and a greedy row, k = 3: each sampled row against its own exact
    distribution; the greedy row always gives the target's greedy sequence."""
    from test_decoding import _chi_square, _exact_sequence_distribution

    target, draft = tiny_pair
    rows_cfg = [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.0, 0, 0.8), (0.0, 0, 1.0)]
    rows, max_len, per_chunk = len(rows_cfg), 4, 5_001
    inputs = _inputs(np.random.default_rng(11), rows, 5, 6)
    t, k, p = (np.array(c) for c in zip(*rows_cfg))
    observed = [dict() for _ in range(rows)]
    for c in range(4):
        r = speculative_sample(
            target,
            draft,
            np.tile(inputs, (per_chunk, 1)),
            rng=jax.random.PRNGKey(91 + c),
            gamma=2,
            max_decode_length=max_len,
            temperature=np.tile(t, per_chunk),
            top_k=np.tile(k, per_chunk),
            top_p=np.tile(p, per_chunk),
            num_drafts=3,
        )
        for idx, (seq, n) in enumerate(zip(np.asarray(r.sequences), np.asarray(r.lengths))):
            key = (0, tuple(seq[:n].tolist()))
            observed[idx % rows][key] = observed[idx % rows].get(key, 0) + 1
    greedy = temperature_sample(target, inputs[3:4], rng=0, max_decode_length=max_len, temperature=0)
    for i, (temp, top_k, top_p) in enumerate(rows_cfg):
        if temp == 0:
            n = int(greedy.lengths[0])
            assert observed[i] == {(0, tuple(np.asarray(greedy.sequences)[0, :n].tolist())): 4 * per_chunk}
            continue
        dist = _exact_sequence_distribution(target, inputs[i : i + 1], Sampler(temp, top_k, top_p), max_len)
        result, bins = _chi_square(observed[i], dist, {0: 4 * per_chunk})
        print(f"\nrow {i} {rows_cfg[i]}: bins={bins} chi2={result.statistic:.1f} p={result.pvalue:.3f}")
        assert result.pvalue > SIGNIFICANCE


# ----------------------------------------------------------------------------------------------------------
# 3. Greedy identity, company, counters


@pytest.mark.parametrize("num_drafts,verification,gamma", [(2, "token", 4), (3, "block", 1), (4, "token", 2)])
def test_greedy_multi_draft_equals_greedy_baseline(num_drafts, verification, gamma):
    """100 inputs of mixed lengths, batches of 50, a perturbed draft: token for token the target's greedy output;
    later branches are kept, and the target is called less often than with one draft."""
    config = _t5_config(vocab=32, d=32)
    target = T5Model.random(config, seed=3)
    draft = _perturbed(target, 0.1, 5)
    inputs = _inputs(np.random.default_rng(7), 100, 12, 32)
    later, calls, single_calls = 0, 0, 0
    for start in range(0, 100, 50):
        batch = inputs[start : start + 50]
        base = temperature_sample(target, batch, rng=0, max_decode_length=16, temperature=0)
        kwargs = dict(rng=0, gamma=gamma, max_decode_length=16, temperature=0, verification=verification)
        r = speculative_sample(target, draft, batch, num_drafts=num_drafts, **kwargs)
        np.testing.assert_array_equal(r.sequences, base.sequences)
        np.testing.assert_array_equal(r.lengths, base.lengths)
        later += int(np.asarray(r.accepted_per_branch)[:, 1:].sum())
        calls += int(np.asarray(r.num_target_calls).sum())
        single_calls += int(np.asarray(speculative_sample(target, draft, batch, **kwargs).num_target_calls).sum())
    assert later > 0 and calls < single_calls, (later, calls, single_calls)


def test_a_row_alone_equals_the_row_in_a_batch_and_counters_add_up(tiny_pair):
    target, draft = tiny_pair
    x = _inputs(np.random.default_rng(3), 16, 5, 6)
    key = jax.random.PRNGKey(4)
    kwargs = dict(gamma=3, max_decode_length=6, num_drafts=2)
    batch = jax.device_get(speculative_sample(target, draft, x, rng=key, **kwargs))
    row_keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(16))
    for i in (0, 9, 15):
        alone = speculative_sample(target, draft, x[i : i + 1], rng=row_keys[i : i + 1], **kwargs)
        np.testing.assert_array_equal(alone.sequences[0], batch.sequences[i])
        np.testing.assert_array_equal(alone.accepted_per_branch[0], batch.accepted_per_branch[i])
    # An iteration keeps at most one branch; draft position 1 is accepted exactly when some branch is kept.
    np.testing.assert_array_equal(batch.accepted_per_branch.sum(1), batch.accepted_per_position[:, 0])
    assert np.all(batch.accepted_per_branch.sum(1) <= batch.num_target_calls)


def test_draft_equal_to_target_at_temperature_zero_keeps_the_first_branch(tiny_pair):
    target, _ = tiny_pair
    x = _inputs(np.random.default_rng(3), 8, 5, 6)
    r = speculative_sample(target, target, x, rng=0, gamma=3, max_decode_length=8, temperature=0, num_drafts=3)
    base = temperature_sample(target, x, rng=0, max_decode_length=8, temperature=0)
    np.testing.assert_array_equal(r.sequences, base.sequences)
    assert r.acceptance_rate == 1.0 and np.asarray(r.accepted_per_branch)[:, 1:].sum() == 0
    np.testing.assert_array_equal(r.num_target_calls, -(-r.lengths // 4))


def test_multi_draft_is_one_xla_while_loop_without_callbacks(tiny_pair):
    """The whole k = 3 decode compiles to one top-level while loop, no host callback, no infeed/outfeed."""
    import re

    from test_decoding import _callback_targets, _decode_loops, _entry_computation

    from specjax.decoding import lower_speculative_sample

    target, draft = tiny_pair
    x = _inputs(np.random.default_rng(3), 4, 5, 6)
    lowered = lower_speculative_sample(target, draft, x, rng=0, gamma=2, max_decode_length=6, top_k=3, num_drafts=3)
    compiled = lowered.compile().as_text()
    entry = _entry_computation(compiled)
    assert len(_decode_loops(entry)) == 1, entry
    assert not _callback_targets(compiled)
    assert not re.search(r"stablehlo\.(infeed|outfeed|send|recv)\b", lowered.as_text())


# ----------------------------------------------------------------------------------------------------------
# 4. The model's branch windows


@pytest.mark.parametrize("scanned", [False, True])
def test_branch_window_equals_chain_windows_and_commit_equals_the_chain_cache(scanned):
    """``decode_branches`` scores each branch as a chain ``decode`` of its tokens does (float32, 1e-5), over a
    cache with stale slots past the position; ``commit_branch`` leaves the slots a chain window writes."""
    config = _t5_config(vocab=16)
    model = T5Model.random(config, seed=3)
    params = model.params
    x = np.array([[3, 4, 5, 1, 0], [6, 7, 1, 0, 0]], np.int32)
    enc = t5.encode(config, params, x)
    cache = t5.init_cache(config, 2, 12)
    _, cache = t5.decode(config, params, enc, np.array([[0, 5, 6], [0, 7, 8]]), cache, np.zeros(2, np.int32))
    _, cache = t5.decode(config, params, enc, np.array([[9, 9, 9], [2, 2, 2]]), cache, np.array([3, 3]))  # stale
    pos = np.array([3, 2], np.int32)
    branches = np.array([[[4, 5, 6, 7], [4, 8, 9, 10]], [[8, 2, 1, 2], [8, 11, 12, 13]]], np.int32)  # [b, k, w]
    chains = [t5.decode(config, params, enc, branches[:, j], cache, pos) for j in range(2)]
    if scanned:
        stacked = t5.stack_layers(config, params)
        enc_s = t5.encode_scanned(config, stacked, x)
        cache_s = t5.KVCache(jnp.stack(cache.k), jnp.stack(cache.v))
        logits, window = t5.decode_branches_scanned(config, stacked, enc_s, branches, cache_s, pos)
    else:
        logits, window = t5.decode_branches(config, params, enc, branches, cache, pos)
    assert logits.shape == (2, 2, 4, 16)
    for j, (chain_logits, chain_cache) in enumerate(chains):
        np.testing.assert_allclose(logits[:, j], chain_logits, atol=1e-5)
        for slice_rows in (False, True):
            rows = slice(0, 1) if slice_rows else slice(None)  # one-row windows use dynamic slices
            sub = lambda c, rows=rows: jax.tree.map(lambda a: a[:, rows] if scanned else a[rows], c)
            committed = t5.commit_branch(
                sub(cache_s if scanned else cache),
                sub(window),
                np.full(2, j, np.int32)[rows],
                pos[rows],
                4,
                slice_rows,
            )
            got = np.stack(committed.k + committed.v) if not scanned else np.concatenate([committed.k, committed.v])
            want = np.stack(chain_cache.k + chain_cache.v)[:, rows]
            np.testing.assert_allclose(got, want, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------
# 5. Bad settings


def test_bad_multi_draft_settings_raise_before_compiling(tiny_pair, monkeypatch):
    from specjax import decoding

    monkeypatch.setattr(decoding.loop, "_speculative_jit", lambda *a: pytest.fail("compiled before validating"))
    target, draft = tiny_pair
    x = np.array([[3, 4, 1]], np.int32)
    kwargs = dict(gamma=2, max_decode_length=4)
    for bad in (0, 5, 2.0, True):
        with pytest.raises(ValueError, match=r"num_drafts must be an int in \[1, 4\]"):
            speculative_sample(target, draft, x, num_drafts=bad, **kwargs)
    with pytest.raises(ValueError, match="needs a draft model drafting gamma tokens, got PromptLookupDraft"):
        speculative_sample(target, PromptLookupDraft(), x, num_drafts=2, **kwargs)
    with pytest.raises(ValueError, match="confidence-stopped"):
        speculative_sample(target, draft, x, num_drafts=2, draft_confidence_threshold=0.5, **kwargs)
    table = (PositionTable(vocab_size=6), jnp.zeros((8, 6)))
    with pytest.raises(ValueError, match="scores several branches per call"):
        speculative_sample(table, table, x, num_drafts=2, **kwargs)
    small = T5Model.random(_t5_config(vocab=3), seed=0)
    with pytest.raises(ValueError, match="more than the vocabulary"):
        speculative_sample(small, small, np.array([[2, 1]], np.int32), num_drafts=4, **kwargs)


@pytest.mark.slow
def test_greedy_identity_on_newstest_with_the_shipped_pair_in_float32(data_dir):
    """16 newstest2014 lines, batch 16, the shipped mini pair in float32: k = 2 (token) and k = 4 (block) equal
    the target's greedy output token for token, and later branches are kept."""
    from specjax import bench, load_default_pair

    target, draft, tokenizer = load_default_pair(size="mini", dtype="float32")
    lines = (data_dir / "wmt" / "newstest2014.en").read_text(encoding="utf-8").splitlines()[:16]
    (x,) = bench.pad_batches([tokenizer.encode(line)[:63] for line in lines], batch_size=16)
    base = temperature_sample(target, x, rng=0, max_decode_length=48, temperature=0.0)
    for k, verification in ((2, "token"), (4, "block")):
        r = speculative_sample(
            target,
            draft,
            x,
            rng=0,
            gamma=4,
            max_decode_length=48,
            temperature=0.0,
            num_drafts=k,
            verification=verification,
        )
        np.testing.assert_array_equal(r.sequences, base.sequences, err_msg=f"k={k}")
        assert np.asarray(r.accepted_per_branch)[:, 1:].sum() > 0


def test_decoder_passes_num_drafts_and_refuses_bad_values(tiny_pair):
    from specjax import Decoder

    target, draft = tiny_pair
    x = _inputs(np.random.default_rng(3), 4, 5, 6)
    decoder = Decoder(target, draft, gamma=2, max_decode_length=6, num_drafts=2, cost_cache=False)
    r = decoder(x, rng=0, temperature=0.0)
    base = temperature_sample(target, x, rng=0, max_decode_length=6, temperature=0)
    np.testing.assert_array_equal(r.sequences, base.sequences)
    assert np.asarray(r.accepted_per_branch).shape == (4, 2)
    with pytest.raises(ValueError, match=r"num_drafts must be 'auto' or an int in \[1, 4\]"):
        Decoder(target, draft, gamma=2, max_decode_length=6, num_drafts=5)


def test_decoder_num_drafts_auto_runs_one_draft_until_more_measure_faster(tiny_pair, monkeypatch):
    """num_drafts="auto": k = 1 first; at an exploration call a k > 1 runs, and once more right after when that
    call compiled (then it is timed); the k with the best measured tokens/s is kept. Every call at temperature 0
    equals the target's greedy output."""
    from specjax import Decoder, decoder

    monkeypatch.setattr(decoder, "EXPLORE_EVERY", 2)
    target, draft = tiny_pair
    x = _inputs(np.random.default_rng(3), 4, 5, 6)
    base = temperature_sample(target, x, rng=0, max_decode_length=6, temperature=0)
    auto = Decoder(target, draft, gamma=2, max_decode_length=6, num_drafts="auto", cost_cache=False)
    ran = []
    for _ in range(4):
        r = auto(x, rng=0, temperature=0.0)
        np.testing.assert_array_equal(r.sequences, base.sequences)
        ran.append(auto.last_num_drafts)
    assert ran == [1, 1, 2, 2], ran  # call 2 explores k = 2 (compiles), call 3 times it
    assert set(auto._k_rates) == {(4, 2, 1), (4, 2, 2)}
    monkeypatch.setattr(decoder, "EXPLORE_EVERY", 1000)  # no more exploring
    auto._k_rates[(4, 2, 1)], auto._k_rates[(4, 2, 2)] = [1.0], [1e9]  # as if k = 2 measured faster
    auto(x, rng=0, temperature=0.0)
    assert auto.last_num_drafts == 2 and "num_drafts 2" in auto.last_choice.reason
    auto._k_rates[(4, 2, 2)] = [0.5]
    auto(x, rng=0, temperature=0.0)
    assert auto.last_num_drafts == 1


def _dp_iterations(length: int, alpha: float, first: float, gamma: int) -> float:
    """Expected loop iterations for one row of ``length`` tokens when the first draft position is accepted with
    chance ``first`` and each later one with ``alpha`` (γ ``gamma``), by dynamic programming over the tokens left
    (an iteration emits ``min(e, left)``): a reference independent of the decoder's convolution."""
    reach = [1.0] + [first * alpha ** (j - 1) for j in range(1, gamma + 1)]  # P(A >= j)
    pmf = {e: reach[e - 1] - reach[e] for e in range(1, gamma + 1)} | {gamma + 1: reach[gamma]}
    iters = [0.0] * (length + 1)
    for n in range(1, length + 1):
        iters[n] = 1.0 + sum(p * iters[max(n - e, 0)] for e, p in pmf.items())
    return iters[length]


@pytest.mark.parametrize("machine", ["cpu-like", "tpu-like"])
def test_decoder_chooses_gamma_and_num_drafts_jointly_from_costs(tiny_pair, machine):
    """gamma="auto" with num_drafts="auto": the choice is the (γ, k) maximising tokens / (encode + iterations ·
    iteration(γ, k)) over injected costs (no timing), the iterations with the first position's acceptance α · lift_k
    (the lift measured between k drafts and one; here injected) computed independently (``_dp_iterations``; one
    row of 20 tokens, the decoder's prior). A CPU-like machine, where a k-branch window and the draft's k rows
    cost k times one chain's, keeps k = 1; a TPU-like one, where the window costs about the same, takes k = 4.
    Before any k > 1 has run (no lift measured) k = 1 is chosen on both."""
    from specjax.decoder import Costs, Decoder, _Running, expected_tokens, expected_tokens_multi

    target, draft = tiny_pair
    window = [0.010, 0.012, 0.013, 0.015, 0.018, 0.020, 0.024, 0.027, 0.030]  # seconds, chain window of γ + 1
    draft_step, encode = 0.0015, 0.002
    scale = (lambda k: float(k)) if machine == "cpu-like" else (lambda k: 1.0 + 0.02 * k)
    branch = {k: ((0.0,) + tuple(w * scale(k) for w in window[1:]), draft_step * scale(k)) for k in (2, 4)}
    costs = Costs(tuple(window), (0.0,) + (draft_step,) * 8, (encode,) * 9, branch)
    alpha = 0.6
    kwargs = dict(gamma="auto", num_drafts="auto", max_decode_length=40, alpha_prior=alpha, cost_cache=False)
    decoder = Decoder(target, draft, costs={1: costs}, **kwargs)
    x = np.ones((1, 5), np.int32)
    assert decoder.choose(x, 0.0).num_drafts == 1  # nothing measured for k > 1: no lift assumed
    lifts = {1: 0.40, 2: 0.56, 4: 0.72}  # the first position's accepted iterations / iterations, by k
    for k, value in lifts.items():
        decoder._first[(k, "greedy")] = _Running(value, 100.0)
    choice = decoder.choose(x, 0.0)

    def reference(g, k):
        if g == 0:
            return 20 / (encode + 20 * window[0])
        first = min(1.0, alpha * lifts[k] / lifts[1])
        return 20 / (encode + _dp_iterations(20, alpha, first, g) * costs.iteration(g, k))

    expected = {(g, 1): reference(g, 1) for g in range(9)} | {
        (g, k): reference(g, k) for g in range(1, 9) for k in (2, 4)
    }
    got = {(g, 1): v for g, v in choice.predicted.items()} | choice.predicted_drafts
    assert set(got) == set(expected)
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-9), key
    best = max(expected, key=expected.get)
    assert (choice.gamma, choice.num_drafts) == best
    for g in range(1, 9):  # tokens per iteration: the paper's at first = α; 1 + first · (1 + α + … + α^(γ−1))
        assert expected_tokens_multi(alpha, alpha, g) == pytest.approx(expected_tokens(alpha, g), rel=1e-12)
        assert expected_tokens_multi(alpha, 0.9, g) == pytest.approx(1 + 0.9 * sum(alpha**j for j in range(g)))
    assert best[1] == (1 if machine == "cpu-like" else 4), best
    if best[1] > 1:
        assert f"with {best[1]} drafts" in choice.reason
    # A fixed k > 1 with γ auto: that k's windows or the target alone.
    fixed = Decoder(target, draft, costs={1: costs}, **(kwargs | dict(num_drafts=2)))
    fixed._first = decoder._first
    pick = fixed.choose(x, 0.0)
    assert set(pick.predicted) == {0} and {k for _, k in pick.predicted_drafts} == {2}
    assert pick.num_drafts == (2 if pick.gamma > 0 else 1)


def test_decoder_joint_choice_explores_an_unmeasured_num_drafts_and_runs_it(tiny_pair, monkeypatch):
    """gamma="auto", num_drafts="auto", costs injected where one draft wins: after ``EXPLORE_EVERY`` calls a k > 1
    never run is explored (and rerun once, its first call having compiled); every call equals the target's greedy
    output, and the k > 1 calls teach the first position's acceptance for that k."""
    from specjax import Decoder, decoder
    from specjax.decoder import Costs

    monkeypatch.setattr(decoder, "EXPLORE_EVERY", 2)
    target, draft = tiny_pair
    x = _inputs(np.random.default_rng(3), 4, 5, 6)
    base = temperature_sample(target, x, rng=0, max_decode_length=6, temperature=0)
    branch = {k: ((0.0,) + (0.02 * k,) * 2, 0.002 * k) for k in (2, 4)}
    costs = Costs((0.01, 0.02, 0.02), (0.0, 0.002, 0.002), (0.0,) * 3, branch)
    auto = Decoder(
        target,
        draft,
        gamma="auto",
        num_drafts="auto",
        max_decode_length=6,
        candidates=(1, 2),
        cost_cache=False,
        costs={4: costs},
    )
    ran = []
    for _ in range(5):
        r = auto(x, rng=0, temperature=0.0)
        np.testing.assert_array_equal(r.sequences, base.sequences)
        ran.append(auto.last_num_drafts)
    assert ran[:2] == [1, 1] and ran[2] > 1 and ran[3] == ran[2], (ran, auto.last_choice.describe())
    assert (ran[2], "greedy") in auto._first

"""Block verification (Sun et al. 2025, Algorithm 2), prompt-lookup drafting and confidence-stopped
drafting — exactness (exact enumeration; chi-square at significance 0.001 against the tiny target's exact
sequence distribution), greedy identity, and the block-vs-token acceptance guarantee.

Reuses the machinery of tests/test_decoding.py (pytest puts tests/ on sys.path: rootdir-relative imports).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_decoding import (
    SIGNIFICANCE,
    _chi_square,
    _exact_sequence_distribution,
    _inputs,
    _perturbed,
    _t5_config,
    tiny_pair,  # a fixture
)

import specjax
from specjax import PromptLookupDraft, T5Model, bench, speculative_sample, temperature_sample
from specjax.decoding.block import block_acceptance, block_verify
from specjax.decoding.verify import token_verify
from specjax.sampling import Sampler

# ----------------------------------------------------------------------------------------------------------
# Block verification by exact enumeration (no sampling): the rule's output distribution is the target's


def _tables(rng, vocab, depth, scale):
    """{prefix tuple: distribution float64[v]} for every prefix shorter than ``depth``: a context-dependent
    autoregressive model over a tiny vocabulary."""
    return {
        pre: (lambda z: z / z.sum())(np.exp(rng.normal(size=vocab) * scale))
        for n in range(depth)
        for pre in itertools.product(range(vocab), repeat=n)
    }


def _block_outcomes(P, Q, vocab, gamma, lengths_of=None):
    """Every draft block, its draft probability, and (from ``block_acceptance``) the exact probability of each
    ``τ`` (``P(τ = i) = h_i Π_{j > i} (1 - h_j)``: τ is the last i with η_i < h_i) and the residuals.

    A block with ``L < gamma`` drafted slots has probability Π_{i <= L} p_i(x_i), spread evenly over the
    (never drafted) tokens of the later slots, so the blocks still sum to 1."""
    blocks = list(itertools.product(range(vocab), repeat=gamma))
    drafted = np.array(blocks, np.int32)
    p = np.array([[P[bl[:i]] for i in range(gamma)] for bl in blocks], np.float32)
    q = np.array([[Q[bl[:i]] for i in range(gamma + 1)] for bl in blocks], np.float32)
    lengths = np.array([lengths_of(bl) if lengths_of else gamma for bl in blocks], np.int32)
    h, res = block_acceptance(jnp.asarray(drafted), jnp.asarray(p), jnp.asarray(q), jnp.asarray(lengths))
    h, res = np.asarray(h, np.float64), np.asarray(res, np.float64)
    out = []
    for r, bl in enumerate(blocks):
        L = lengths[r]
        p_block = np.prod([P[bl[:i]][bl[i]] for i in range(L)]) / vocab ** (gamma - L)
        p_tau = [(h[r, t - 1] if t else 1.0) * np.prod(1.0 - h[r, t:]) for t in range(gamma + 1)]
        out.append((bl, L, p_block, p_tau, res[r]))
    return out


def _output_distribution(outcomes, Q, vocab, gamma):
    """P(first gamma + 1 tokens) when each iteration's output (accepted drafts + next token) is followed by
    target sampling: equals the target's own distribution iff the verifier is exact."""
    dist = {}
    for bl, _, p_block, p_tau, res in outcomes:
        for tau in range(gamma + 1):
            for y in range(vocab):
                head = bl[:tau] + (y,)
                w = p_block * p_tau[tau] * res[tau, y]
                for tail in itertools.product(range(vocab), repeat=gamma + 1 - len(head)):
                    s = head + tail
                    dist[s] = dist.get(s, 0.0) + w * np.prod([Q[s[:i]][s[i]] for i in range(len(head), gamma + 1)])
    return dist


@pytest.mark.parametrize("lengths", ["full", "stopping_time", "none", "two"])
def test_block_verification_output_distribution_is_the_target_exactly(lengths):
    """V = 3, gamma = 3, context-dependent p and q: the exact output distribution of the rule (Theorem 1 of
    the paper) equals the target's to float32 rounding, also for proposals shorter than gamma (lengths 0, 2,
    and a stopping time of the drafts, as confidence-stopped drafting produces)."""
    vocab, gamma = 3, 3
    rng = np.random.default_rng(0)
    Q, P = _tables(rng, vocab, gamma + 2, 1.5), _tables(rng, vocab, gamma + 2, 1.5)
    lengths_of = {
        "full": None,
        "none": lambda bl: 0,
        "two": lambda bl: 2,
        "stopping_time": lambda bl: 1 + next((i for i in range(gamma - 1) if P[bl[:i]][bl[i]] < 0.4), gamma - 1),
    }[lengths]
    outcomes = _block_outcomes(P, Q, vocab, gamma, lengths_of)
    got = _output_distribution(outcomes, Q, vocab, gamma)
    for s in itertools.product(range(vocab), repeat=gamma + 1):
        want = np.prod([Q[s[:i]][s[i]] for i in range(gamma + 1)])
        assert got.get(s, 0.0) == pytest.approx(want, abs=1e-6), s
    if lengths_of is not None:  # nothing past the drafted slots is ever accepted
        assert all(p_tau[t] < 1e-12 for _, L, _, p_tau, _ in outcomes for t in range(L + 1, gamma + 1))


def _expected_accepted(outcomes, P, Q, gamma):
    """(E[τ] of block verification, E[accepted] of token verification) over the same draft blocks."""
    block = sum(p_block * np.dot(p_tau, np.arange(gamma + 1)) for _, _, p_block, p_tau, _ in outcomes)
    token = 0.0
    for bl, _, p_block, _, _ in outcomes:
        survive = np.cumprod([min(1.0, Q[bl[:i]][bl[i]] / P[bl[:i]][bl[i]]) for i in range(gamma)])
        token += p_block * survive.sum()
    return block, token


def test_block_verification_accepts_at_least_as_many_as_token_verification():
    """Exact expectations by enumeration. The paper's section 1 example (context-free q = (1/3, 2/3),
    p = (2/3, 1/3), gamma = 2): token verification accepts 10/9 tokens per iteration, block 11/9. Then 6
    random context-dependent pairs, gamma 2 and 3: block >= token every time (Theorem 2), > in most."""
    Q = {pre: np.array([1 / 3, 2 / 3]) for n in range(4) for pre in itertools.product(range(2), repeat=n)}
    P = {pre: np.array([2 / 3, 1 / 3]) for n in range(4) for pre in itertools.product(range(2), repeat=n)}
    block, token = _expected_accepted(_block_outcomes(P, Q, 2, 2), P, Q, 2)
    assert block == pytest.approx(11 / 9, abs=1e-6) and token == pytest.approx(10 / 9, abs=1e-6)

    vocab = 3
    rng = np.random.default_rng(5)
    gains = []
    for trial in range(6):
        gamma = 2 + trial % 2
        Q, P = _tables(rng, vocab, gamma + 2, 1.0 + trial / 3), _tables(rng, vocab, gamma + 2, 1.0 + trial / 3)
        block, token = _expected_accepted(_block_outcomes(P, Q, vocab, gamma), P, Q, gamma)
        assert block >= token - 1e-6, (trial, block, token)
        gains.append(block - token)
    assert sum(g > 1e-3 for g in gains) >= 4, gains


def test_block_verify_samples_tau_with_the_enumerated_probabilities():
    """``block_verify`` (the sampling path the loop runs) draws τ with the probabilities the enumeration
    uses: 200k rows of one fixed block, chi-square at significance 0.001; and greedy (one-hot p, q) gives
    token verification's count and the target's argmax."""
    from scipy import stats

    vocab, gamma = 4, 3
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.ones(vocab), size=gamma).astype(np.float32)
    q = rng.dirichlet(np.ones(vocab), size=gamma + 1).astype(np.float32)
    drafted = np.array([0, 1, 2], np.int32)
    rows = 200_000
    h, _ = block_acceptance(jnp.asarray(drafted[None]), jnp.asarray(p[None]), jnp.asarray(q[None]))
    h = np.asarray(h[0], np.float64)
    p_tau = np.array([(h[t - 1] if t else 1.0) * np.prod(1.0 - h[t:]) for t in range(gamma + 1)])
    keys = jax.random.split(jax.random.PRNGKey(0), rows)
    tau, _, _ = jax.jit(block_verify)(
        keys, jnp.tile(drafted, (rows, 1)), jnp.tile(p, (rows, 1, 1)), jnp.tile(q, (rows, 1, 1))
    )
    counts = np.bincount(np.asarray(tau), minlength=gamma + 1)
    keep = p_tau * rows >= 5
    assert (
        stats.chisquare(counts[keep], p_tau[keep] * rows * counts[keep].sum() / (p_tau[keep].sum() * rows)).pvalue
        > SIGNIFICANCE
    )

    target_argmax = np.array([0, 1, 3, 2])
    q1 = np.eye(vocab, dtype=np.float32)[target_argmax][None]
    p1 = np.eye(vocab, dtype=np.float32)[drafted][None]
    for f in (block_verify, token_verify):
        a, nxt, _ = f(jax.random.split(jax.random.PRNGKey(1), 1), jnp.asarray(drafted[None]), p1, q1)
        assert (int(a[0]), int(nxt[0])) == (2, 3)


# ----------------------------------------------------------------------------------------------------------
# Prompt lookup: proposals on hand-made rows


def test_prompt_lookup_proposals():
    """The most recent earlier occurrence of the last n tokens (n = max_ngram down to min_ngram), in the row's
    output before its input; up to gamma following tokens from the same segment; no match -> length 0."""
    draft = PromptLookupDraft(max_ngram=2, min_ngram=1)
    enc = jnp.asarray(
        [
            [5, 6, 7, 8, 9, 1, 0, 0],
            [5, 6, 7, 8, 9, 1, 0, 0],
            [5, 6, 7, 8, 9, 1, 0, 0],
            [2, 3, 4, 1, 0, 0, 0, 0],
            [5, 6, 7, 1, 0, 0, 0, 0],
            [5, 6, 7, 1, 0, 0, 0, 0],
        ]
    )
    T, gamma = 10, 3
    seqs = np.zeros((6, T), np.int32)
    seqs[0, :2] = [4, 6]  # bigram "4 6" nowhere earlier; unigram "6" in the input -> "7 8 9"
    seqs[1, :6] = [5, 6, 4, 4, 5, 6]  # bigram "5 6" last: most recent earlier one is output 0..1 -> "4 4 5"
    seqs[2, :3] = [9, 5, 6]  # bigram "5 6": not in the output before; in the input -> "7 8 9"
    seqs[3, :2] = [9, 9]  # bigram "9 9" nowhere; unigram "9": the output's own 9 at 0 -> "9"
    seqs[4, :1] = [6]  # "6" in the input, followed by "7 1" then padding: 2 tokens
    # row 5: nothing emitted yet -> length 0
    n = jnp.asarray([2, 6, 3, 2, 1, 0], jnp.int32)
    context, carry = draft.start(None, enc, T + gamma + 1)
    prop, _ = draft.propose(None, context, carry, jnp.asarray(seqs), n, None, None, gamma)
    assert prop.probs is None
    assert np.asarray(prop.lengths).tolist() == [3, 3, 3, 1, 2, 0]
    tokens = np.asarray(prop.tokens)
    assert tokens[0].tolist() == [7, 8, 9] and tokens[1].tolist() == [4, 4, 5] and tokens[2].tolist() == [7, 8, 9]
    assert tokens[3, :1].tolist() == [9] and tokens[4, :2].tolist() == [7, 1]
    # Padding in the input is never matched: a row whose last token is the pad id finds nothing.
    seqs0 = np.zeros((1, T), np.int32)
    seqs0[0, :1] = [0]
    prop, _ = draft.propose(None, context[3:4], None, jnp.asarray(seqs0), jnp.asarray([1]), None, None, gamma)
    assert int(prop.lengths[0]) == 0


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        PromptLookupDraft(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match="max_ngram must be an int >= 1"):
        PromptLookupDraft(max_ngram=0)
    target = T5Model.random(_t5_config(vocab=8), seed=0)
    x = np.array([[3, 4, 1]])
    with pytest.raises(ValueError, match="draft_confidence_threshold needs a draft model"):
        speculative_sample(target, PromptLookupDraft(), x, gamma=2, max_decode_length=4, draft_confidence_threshold=0.5)
    with pytest.raises(ValueError, match="number in \\[0, 1\\]"):
        speculative_sample(target, target, x, gamma=2, max_decode_length=4, draft_confidence_threshold=1.5)


# ----------------------------------------------------------------------------------------------------------
# Exactness end to end: chi-square against the tiny target's exact sequence distribution


def _chi_square_run(target, draft, warp, gamma, batch, seed, **kwargs):
    """~100k samples in 5 calls of ~20k rows; returns (chi-square result, bins, mean alpha, result of the
    last call)."""
    max_len = 4
    inputs = _inputs(np.random.default_rng(batch), batch, 5, 6)
    dist = _exact_sequence_distribution(target, inputs, Sampler(**warp), max_len)
    per_chunk = 20_006 // batch
    observed, rows_per_input, alpha = {}, dict.fromkeys(range(batch), 0), []
    for c in range(5):
        r = speculative_sample(
            target,
            draft,
            np.tile(inputs, (per_chunk, 1)),
            rng=jax.random.PRNGKey(seed + c),
            gamma=gamma,
            max_decode_length=max_len,
            **warp,
            **kwargs,
        )
        alpha.append(r.acceptance_rate)
        for idx, (seq, n) in enumerate(zip(np.asarray(r.sequences), np.asarray(r.lengths))):
            key = (idx % batch, tuple(seq[:n].tolist()))
            observed[key] = observed.get(key, 0) + 1
        for i in range(batch):
            rows_per_input[i] += per_chunk
    assert sum(rows_per_input.values()) >= 100_000
    result, bins = _chi_square(observed, dist, rows_per_input)
    return result, bins, float(np.mean(alpha)), r


BLOCK_CASES = [  # (warping, gamma, batch): every warping, gamma and batch is covered
    (dict(temperature=1.0), 2, 1),
    (dict(temperature=1.0), 4, 7),
    (dict(temperature=0.7, top_k=3), 2, 7),
    (dict(temperature=0.7, top_k=3), 4, 1),
]


@pytest.mark.slow
@pytest.mark.parametrize("warp,gamma,batch", BLOCK_CASES)
def test_block_verification_matches_target_sequence_distribution(tiny_pair, warp, gamma, batch):
    target, draft = tiny_pair
    result, bins, alpha, _ = _chi_square_run(target, draft, warp, gamma, batch, 2000, verification="block")
    print(
        f"\nblock {warp} gamma={gamma} batch={batch}: bins={bins} chi2={result.statistic:.1f} "
        f"p={result.pvalue:.3f} alpha={alpha:.3f}"
    )
    assert 0.01 < alpha < 0.99
    assert result.pvalue > SIGNIFICANCE


@pytest.mark.slow
@pytest.mark.parametrize("verification", ["token", "block"])
def test_prompt_lookup_matches_target_sequence_distribution(tiny_pair, verification):
    """Prompt lookup at temperature 1 (gamma 3, batch 7): matches happen (inputs and outputs share the tiny
    vocabulary) and are rejected often; rows without a match emit the target's token alone."""
    target, _ = tiny_pair
    result, bins, alpha, r = _chi_square_run(
        target, PromptLookupDraft(max_ngram=2), dict(temperature=1.0), 3, 7, 3000, verification=verification
    )
    drafted_per_call = np.asarray(r.num_draft_tokens).sum() / np.asarray(r.num_target_calls).sum()
    print(
        f"\nprompt lookup ({verification}): bins={bins} chi2={result.statistic:.1f} p={result.pvalue:.3f} "
        f"alpha={alpha:.3f} drafted/call={drafted_per_call:.2f}"
    )
    assert 0.01 < alpha < 0.99 and 0.1 < drafted_per_call < 3
    assert result.pvalue > SIGNIFICANCE


@pytest.mark.slow
@pytest.mark.parametrize("verification,batch", [("token", 7), ("block", 1)])
def test_confidence_stopped_drafting_matches_target_sequence_distribution(tiny_pair, verification, batch):
    """Confidence stop at temperature 1 (gamma 4, threshold 0.5): rows draft 1 to 4 tokens."""
    target, draft = tiny_pair
    result, bins, alpha, r = _chi_square_run(
        target, draft, dict(temperature=1.0), 4, batch, 4000, verification=verification, draft_confidence_threshold=0.5
    )
    drafted_per_call = np.asarray(r.num_draft_tokens).sum() / np.asarray(r.num_target_calls).sum()
    print(
        f"\nconfidence stop ({verification}, batch {batch}): bins={bins} chi2={result.statistic:.1f} "
        f"p={result.pvalue:.3f} alpha={alpha:.3f} drafted/call={drafted_per_call:.2f}"
    )
    assert 0.01 < alpha < 0.99 and 1.05 < drafted_per_call < 3.5
    assert result.pvalue > SIGNIFICANCE


# ----------------------------------------------------------------------------------------------------------
# Greedy identity: token for token the target's greedy temperature_sample

GREEDY_PATHS = {  # name: (draft factory from (target, draft model), speculative_sample keywords, gamma)
    "block": (lambda t, d: d, dict(verification="block"), 4),
    "prompt_lookup": (lambda t, d: PromptLookupDraft(max_ngram=3), {}, 3),
    "prompt_lookup_block": (lambda t, d: PromptLookupDraft(max_ngram=3), dict(verification="block"), 3),
    "confidence_stop": (lambda t, d: d, dict(draft_confidence_threshold=0.1), 4),
}


@pytest.mark.parametrize("path", list(GREEDY_PATHS))
def test_greedy_identity_on_random_models(path):
    """200 inputs of mixed lengths, batches of 50, a perturbed draft: equal to target-greedy token for token."""
    make_draft, kwargs, gamma = GREEDY_PATHS[path]
    config = _t5_config(vocab=32, d=32)
    target = T5Model.random(config, seed=3)
    draft = make_draft(target, _perturbed(target, 0.1, 5))
    inputs = _inputs(np.random.default_rng(7), 200, 12, 32)
    drafted, calls = 0, 0
    for start in range(0, 200, 50):
        batch = inputs[start : start + 50]
        base = temperature_sample(target, batch, rng=0, max_decode_length=16, temperature=0)
        r = speculative_sample(target, draft, batch, rng=0, gamma=gamma, max_decode_length=16, temperature=0, **kwargs)
        np.testing.assert_array_equal(r.sequences, base.sequences)
        np.testing.assert_array_equal(r.lengths, base.lengths)
        drafted += np.asarray(r.num_draft_tokens).sum()
        calls += np.asarray(r.num_target_calls).sum()
    if path == "confidence_stop":  # the threshold bites: between 1 and gamma drafts per call
        assert 1.05 < drafted / calls < gamma - 0.05, drafted / calls


@pytest.fixture(scope="module")
def shipped():
    return specjax.load_default_pair(size="mini")


@pytest.mark.slow
def test_greedy_identity_on_real_sentences_with_the_shipped_pair(shipped, data_dir):
    """16 Multi30k test sentences, batch 16: block, prompt lookup and confidence stop equal the target's greedy
    output token for token."""
    target, draft, tokenizer = shipped
    lines = (data_dir / "train" / "multi30k" / "test_2016_flickr.en").read_text().splitlines()[:16]
    (x,) = bench.pad_batches([tokenizer.encode(l) for l in lines], batch_size=16)
    base = temperature_sample(target, x, rng=0, max_decode_length=48, temperature=0.0)
    for name, (make_draft, kwargs, gamma) in GREEDY_PATHS.items():
        r = speculative_sample(
            target,
            make_draft(target, draft),
            x,
            rng=0,
            gamma=gamma,
            max_decode_length=48,
            temperature=0.0,
            **(dict(draft_confidence_threshold=0.5) if name == "confidence_stop" else kwargs),
        )
        np.testing.assert_array_equal(r.sequences, base.sequences, err_msg=name)

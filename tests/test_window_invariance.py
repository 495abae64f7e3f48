"""Exact on every path: a verification window computes what the one-token step computes, bit for bit, on the
dtype path this machine picks by default and on a forced bfloat16 path (so a CPU without bfloat16 dots covers
it too); greedy speculative output equals the target alone on real newstest2014 lines; and a model closed over
in a user's ``jax.jit`` leaves nothing traced behind.

References: numpy (sums), the one-token step itself (logits), ``temperature_sample`` (greedy output).
Multi-draft branch windows (``num_drafts`` > 1) are held to the same: their logits against the steps', their
greedy output against the target alone's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import hardware
from specjax.bench.invariance import branch_step_mismatch, window_step_mismatch
from specjax.config import T5Config
from specjax.decoding import PromptLookupDraft, speculative_sample, temperature_sample
from specjax.models.t5 import T5Model, fixed_order_softmax, fixed_order_sum

# ----------------------------------------------------------------------------------------------------------
# The fixed-order reductions


def test_fixed_order_sum_is_the_sum_and_its_bits_do_not_depend_on_rows_or_padding():
    rng = np.random.default_rng(0)
    for m in (1, 2, 5, 64, 70, 512):
        x = rng.standard_normal((9, m)).astype(np.float32)
        got = np.asarray(jax.jit(fixed_order_sum)(x))
        np.testing.assert_allclose(got, x.astype(np.float64).sum(-1), rtol=1e-5, atol=1e-5)
        # Row 0 alone, among 9 rows, and with zero columns appended: the same bits.
        alone = np.asarray(jax.jit(fixed_order_sum)(x[:1]))
        padded = np.asarray(jax.jit(fixed_order_sum)(np.pad(x, ((0, 0), (0, 37)))))
        np.testing.assert_array_equal(alone, got[:1])
        np.testing.assert_array_equal(padded, got)
    # Integers in float32 are summed exactly.
    ints = rng.integers(-1000, 1000, size=(4, 300)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(fixed_order_sum(ints)), ints.sum(-1))


def test_fixed_order_softmax_matches_numpy_and_keeps_masked_weights_zero():
    rng = np.random.default_rng(1)
    s = rng.standard_normal((3, 2, 5, 40)).astype(np.float32) * 4
    s[..., 30:] += -1e10  # masked slots (t5x's bias)
    got = np.asarray(fixed_order_softmax(jnp.asarray(s)))
    e = np.exp(s.astype(np.float64) - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=2e-6, atol=1e-7)
    assert np.all(got[..., 30:] == 0.0)


# ----------------------------------------------------------------------------------------------------------
# Window = step, bit for bit, on the shipped small pair


def _dtype_paths():
    """The machine's default dtype path ("auto") and, where that is float32 (no bfloat16 dots), bfloat16 forced."""
    auto = specjax.defaults.pair_dtypes("small")[0]
    return ["auto"] + [d for d in ("bfloat16", "float32") if d != auto]


@pytest.fixture(scope="module", params=_dtype_paths())
def small_target(request):
    target, draft, tok = specjax.load_default_pair(dtype=request.param)
    return target, draft, tok


@pytest.mark.parametrize("batch,gamma", [(1, 4), (1, 8), (3, 5), (8, 3)])
def test_window_logits_equal_step_logits_bit_for_bit(small_target, batch, gamma):
    """The target's logits from speculative windows (ragged accepted counts, a cache of T + γ + 1 slots) against
    the target alone's steps (a cache of T + 1 slots), each compiled as its loop is (``window_step_mismatch``:
    from batch 2 the step feeds one token with two attention query rows, ``baseline.decode_step``).
    (A float32 window of 40 or more rows beside a step of fewer is a stated limit: docs/performance.md.)"""
    target, _, tok = small_target
    lines = ["A man is riding a bicycle down the street.", "Two dogs play in the snow.", "The children sit."]
    x = np.asarray(tok.encode_batch([lines[i % len(lines)] for i in range(batch)]))
    x = np.pad(x, ((0, 0), (0, 32 - x.shape[1])))
    got = window_step_mismatch(target, x, gamma, max_decode_length=16, seed=gamma)
    assert got["total"] == batch * 16 * 8000
    assert got["differ"] == 0, f"{target.config.dtype}: {got}"


@pytest.mark.parametrize("batch,gamma,num_drafts", [(1, 5, 4), (3, 3, 2)])
def test_branch_window_logits_equal_step_logits_bit_for_bit(small_target, batch, gamma, num_drafts):
    """Multi-draft: the kept branch of a ``decode_branches`` window (``num_drafts`` branches, the true tokens in a
    random one, the others random) against the target alone's steps, bit for bit (``branch_step_mismatch``): each
    branch attends over its own copy of the committed cache with its window written in, as a chain window does."""
    target, _, tok = small_target
    lines = ["A man is riding a bicycle down the street.", "Two dogs play in the snow.", "The children sit."]
    x = np.asarray(tok.encode_batch(lines[:batch]))
    x = np.pad(x, ((0, 0), (0, 32 - x.shape[1])))
    got = branch_step_mismatch(target, x, gamma, num_drafts, max_decode_length=16, seed=gamma)
    assert got["total"] == batch * 16 * 8000
    assert got["differ"] == 0, f"{target.config.dtype}: {got}"


# Lines of newstest2014: the first 12, and line 50 (92 tokens), whose greedy output differed from the target alone
# on the bfloat16 path while softmax's max was an XLA reduction (AMD EPYC Zen 4, AVX512_BF16).
NEWSTEST_LINES = list(range(12)) + [50]


def test_greedy_speculative_equals_target_alone_on_newstest(small_target, data_dir):
    target, draft, tok = small_target
    lines = (data_dir / "wmt" / "newstest2014.en").read_text().splitlines()
    sources = {
        "model draft": dict(draft=draft),
        "prompt lookup": dict(draft=PromptLookupDraft()),
        "confidence stop": dict(draft=draft, draft_confidence_threshold=0.3),
        "block verification": dict(draft=draft, verification="block"),
    }
    differ = {name: [] for name in sources}
    for i in NEWSTEST_LINES:
        ids = tok.encode(lines[i])[:127]
        x = np.asarray([ids + [0] * (128 - len(ids))], np.int32)
        base = temperature_sample(target, x, rng=0, max_decode_length=64, temperature=0.0)
        for name, kw in sources.items():
            kw = dict(kw)
            spec = speculative_sample(
                target, kw.pop("draft"), x, rng=0, gamma=5, max_decode_length=64, temperature=0.0, **kw
            )
            if not (np.array_equal(spec.sequences, base.sequences) and np.array_equal(spec.lengths, base.lengths)):
                differ[name].append(i)
    assert all(not v for v in differ.values()), f"{target.config.dtype}: lines that differ {differ}"


def test_greedy_multi_draft_equals_target_alone_on_newstest(small_target, data_dir):
    """num_drafts = 2 (token rule) and 4 (block rule), the model draft, γ 3: the first 4 newstest2014 lines, each
    alone (batch 1), 32 tokens, equal the target alone's greedy output token for token on this dtype path, and
    some iteration keeps a branch other than the draft's first choice."""
    target, draft, tok = small_target
    lines = (data_dir / "wmt" / "newstest2014.en").read_text().splitlines()[:4]
    differ, later = [], 0
    for i, line in enumerate(lines):
        ids = tok.encode(line)[:31]
        x = np.asarray([ids + [0] * (32 - len(ids))], np.int32)
        base = temperature_sample(target, x, rng=0, max_decode_length=32, temperature=0.0)
        for k, verification in ((2, "token"), (4, "block")):
            spec = speculative_sample(
                target,
                draft,
                x,
                rng=0,
                gamma=3,
                max_decode_length=32,
                temperature=0.0,
                num_drafts=k,
                verification=verification,
            )
            later += int(np.asarray(spec.accepted_per_branch)[:, 1:].sum())
            if not (np.array_equal(spec.sequences, base.sequences) and np.array_equal(spec.lengths, base.lengths)):
                differ.append((i, k))
    assert not differ, f"{target.config.dtype}: (line, num_drafts) that differ {differ}"
    assert later > 0


def test_default_dtype_path_is_what_this_cpu_gets():
    """The fixture's "auto" path is bfloat16 exactly where the CPU has native bfloat16 dots."""
    expected = "bfloat16" if hardware.native_bf16_dots() else "float32"
    assert specjax.defaults.pair_dtypes("small")[0] == expected


# ----------------------------------------------------------------------------------------------------------
# Nothing cached while tracing: a model closed over in a user's jit, then used eagerly, and the reverse


def _tiny_t5_1_1(dtype):
    cfg = T5Config(
        vocab_size=32,
        d_model=16,
        num_heads=2,
        head_dim=8,
        mlp_dim=32,
        num_encoder_layers=2,
        num_decoder_layers=2,
        mlp_activations=("gelu", "linear"),
        logits_via_embedding=False,
        name="tiny",
    )
    return T5Model.random(cfg, seed=3).astype(dtype)


X = np.array([[5, 6, 7, 1], [9, 10, 1, 0]], np.int32)


def _entry_points():
    """name -> f(target, draft) returning an array, each a public entry point on its own."""
    from specjax import parallel
    from specjax.decoder import Decoder

    kw = dict(rng=jax.random.PRNGKey(0), max_decode_length=6, temperature=0.0)
    mesh = parallel.make_mesh("data:1,model:1")
    return {
        "speculative_sample": lambda t, d: speculative_sample(t, d, X, gamma=3, **kw).sequences,
        "temperature_sample": lambda t, d: temperature_sample(t, X, **kw).sequences,
        "T5Model.logits": lambda t, d: t.logits(X, np.zeros((2, 3), np.int32)),
        "data_parallel_sample": lambda t, d: parallel.data_parallel_sample(temperature_sample, t, X, **kw).sequences,
        "model_parallel_sample": lambda t, d: (
            parallel.model_parallel_sample(speculative_sample, t, d, X, mesh=mesh, gamma=2, **kw).sequences
        ),
    }


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("order", ["jit_then_eager", "eager_then_jit"])
def test_model_closed_over_in_a_user_jit_and_used_eagerly(dtype, order):
    target, draft = _tiny_t5_1_1(dtype), _tiny_t5_1_1("float32")
    fresh = lambda: (T5Model(target.config, target.params), T5Model(draft.config, draft.params))
    entries = _entry_points()
    expected = {name: np.asarray(f(*fresh())) for name, f in entries.items()}
    traced = ("speculative_sample", "temperature_sample", "T5Model.logits")  # traceable inside a user's jit
    for name, f in entries.items():
        # The host-level runners (their own sharded programs) are called eagerly, after or before the same
        # model objects were closed over in a user's jit by a traceable entry point.
        g = f if name in traced else entries["speculative_sample"]
        in_jit = lambda g=g: jax.jit(lambda: g(target, draft))()  # the models are closed over, not arguments
        eager = lambda f=f: f(target, draft)
        calls = [(in_jit, g), (eager, f)] if order == "jit_then_eager" else [(eager, f), (in_jit, g)]
        for call, which in calls + calls:  # and once more in the same order: no state left from the first round
            which_name = name if which is f else "speculative_sample"
            got, msg = np.asarray(call()), f"{name} {dtype} {order}"
            if which_name == "T5Model.logits":  # another program (weights as constants): equal up to rounding
                np.testing.assert_allclose(got, expected[which_name], rtol=2e-2 if dtype == "bfloat16" else 1e-5)
            else:
                np.testing.assert_array_equal(got, expected[which_name], err_msg=msg)
    # The Decoder (host-side γ choice, never traced) with the same objects after the traced calls.
    from specjax.decoder import Decoder

    out = Decoder(target, draft, gamma=2, max_decode_length=6, cost_cache=False)(X, rng=0, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(out.sequences), expected["temperature_sample"])
    leaves = jax.tree_util.tree_leaves(target.__dict__)
    assert not any(isinstance(v, jax.core.Tracer) for v in leaves), "a tracer was kept on the model"

"""The explicit KV cache: windowed decoding equals one uncached teacher-forced pass.

Decoding a sequence one token at a time (k=1), in windows of k=2..8, with rows at different positions
in the same call, and after stale garbage was written past a row's position and the row was rolled back,
must all give the logits of ``T5Model.logits`` (fp32, atol 1e-5). This is the contract the speculative
loop relies on (DESIGN.md, "The decode contract").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import T5Config, T5Model
from specjax.models import t5

ATOL = 1e-5
T = 11  # decoder length
TINY = dict(
    vocab_size=50,
    d_model=16,
    num_heads=2,
    head_dim=8,
    mlp_dim=32,
    num_encoder_layers=2,
    num_decoder_layers=2,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
)
FAMILIES = {
    "t5_1_0": dict(gated_gelu=False, logits_via_embedding=True),
    "t5_1_1": dict(gated_gelu=True, logits_via_embedding=False),
}


@functools.partial(jax.jit, static_argnums=0)
def _decode(config, params, encoded, tokens, cache, positions):
    return t5.decode(config, params, encoded, tokens, cache, positions)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def setup(request):
    cfg = T5Config(**TINY, **FAMILIES[request.param])
    model = T5Model.random(cfg, seed=1)
    rng = np.random.default_rng(0)
    enc = rng.integers(3, cfg.vocab_size, size=(2, 9)).astype(np.int32)
    enc[0, 6:] = 0  # padding in row 0
    dec = rng.integers(2, cfg.vocab_size, size=(2, T)).astype(np.int32)
    dec[:, 0] = cfg.pad_id
    full = np.asarray(model.logits(enc, dec))
    encoded = t5.encode(cfg, model.params, enc)
    return cfg, model, encoded, dec, full


def run_schedule(cfg, model, encoded, dec, k, advance, cache=None, positions=None, garbage=None):
    """Decodes ``dec`` in windows of ``k`` tokens; row i moves ``advance[i]`` (<= k) positions per call.

    Tokens past a row's advance (and past T) are garbage ids; they are written into the cache and must be
    masked later, then overwritten. Returns the per-position logits [b, T, v] collected from each row's
    accepted part of each window.
    """
    b = dec.shape[0]
    rng = np.random.default_rng(k)
    cache = t5.init_cache(cfg, b, T + 8) if cache is None else cache
    pos = np.zeros(b, np.int32) if positions is None else positions.copy()
    out = np.full((b, T, cfg.vocab_size), np.nan, np.float32)
    while (pos < T).any():
        window = rng.integers(2, cfg.vocab_size, size=(b, k)).astype(np.int32)  # garbage by default
        for i in range(b):
            n = min(k, T - pos[i])
            if n > 0:
                window[i, :n] = dec[i, pos[i] : pos[i] + n]
        logits, cache = _decode(cfg, model.params, encoded, window, cache, pos)
        logits = np.asarray(logits)
        for i in range(b):
            n = min(advance[i], T - pos[i])
            if n > 0:
                out[i, pos[i] : pos[i] + n] = logits[i, :n]
        pos = np.minimum(pos + np.asarray(advance, np.int32), T)
    return out, cache


@pytest.mark.parametrize("k", range(1, 9))
def test_windows_equal_uncached_forward(setup, k):
    cfg, model, encoded, dec, full = setup
    got, _ = run_schedule(cfg, model, encoded, dec, k, advance=[k, k])
    np.testing.assert_allclose(got, full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("advance", [(3, 2), (1, 4), (5, 3)])
def test_rows_at_different_positions(setup, advance):
    """One call, rows at different positions; the un-advanced tail of a window is rolled back."""
    cfg, model, encoded, dec, full = setup
    got, _ = run_schedule(cfg, model, encoded, dec, max(advance), advance=list(advance))
    np.testing.assert_allclose(got, full, atol=ATOL, rtol=0)


def test_stale_entries_beyond_position_are_masked(setup):
    cfg, model, encoded, dec, full = setup
    rng = np.random.default_rng(7)
    cache = t5.init_cache(cfg, 2, T + 8)
    # Decode the true prefix up to position 4 (row 0) and 6 (row 1).
    prefix = np.array([4, 6], np.int32)
    window = np.stack([dec[0, :6], dec[1, :6]])
    _, cache = _decode(cfg, model.params, encoded, window, cache, np.zeros(2, np.int32))
    # Write garbage windows at and past each row's position, twice, at different offsets.
    for start in (prefix, prefix + 2):
        junk = rng.integers(2, cfg.vocab_size, size=(2, 6)).astype(np.int32)
        _, cache = _decode(cfg, model.params, encoded, junk, cache, start)
    # Roll back to ``prefix`` and continue with the true tokens; the garbage slots must not leak.
    got, _ = run_schedule(cfg, model, encoded, dec, 3, advance=[3, 2], cache=cache, positions=prefix)
    np.testing.assert_allclose(got[0, 4:], full[0, 4:], atol=ATOL, rtol=0)
    np.testing.assert_allclose(got[1, 6:], full[1, 6:], atol=ATOL, rtol=0)


# ----------------------------------------------------------------------------------------------------------
# An independent reference: the T5 decoder written out in numpy (float64) from the parameter pytree.


def _np_bucket(rel, num_buckets, max_distance):
    """Unidirectional T5 bucket of ``memory - query`` (Raffel et al. 2020, section 2.1), in numpy."""
    n = np.maximum(-rel, 0)
    max_exact = num_buckets // 2
    with np.errstate(divide="ignore"):
        large = max_exact + (
            np.log(n / max_exact + np.finfo(np.float32).eps)
            / np.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).astype(np.int64)
    return np.where(n < max_exact, n, np.minimum(large, num_buckets - 1))


def _np_decoder(cfg, params, hidden_bsd, enc_mask_bs, dec_bt):
    """Teacher-forced decoder logits [b, t, v] in float64 numpy: causal self-attention with the bucketed
    relative-position bias, cross-attention to the encoder states, T5 1.0 / 1.1 MLP and head."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    dp = p["decoder"]
    n, h = cfg.num_heads, cfg.head_dim

    def norm(x, scale):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.layer_norm_epsilon) * scale

    def attn(ap, x, mem, bias):
        q = (x @ ap["query"]["kernel"]).reshape(x.shape[:2] + (n, h))
        k = (mem @ ap["key"]["kernel"]).reshape(mem.shape[:2] + (n, h))
        v = (mem @ ap["value"]["kernel"]).reshape(mem.shape[:2] + (n, h))
        s = np.einsum("bqnh,bmnh->bnqm", q, k) + bias
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        return np.einsum("bnqm,bmnh->bqnh", w, v).reshape(x.shape[:2] + (n * h,)) @ ap["out"]["kernel"]

    b, t = dec_bt.shape
    pos = np.arange(t)
    bucket = _np_bucket(
        pos[None, :] - pos[:, None], cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance
    )  # [q, m]
    self_bias = dp["relpos_bias"]["rel_embedding"][:, bucket] + np.where(pos[None, :] <= pos[:, None], 0, -1e10)
    cross_bias = np.where(enc_mask_bs[:, None, None, :], 0.0, -1e10)
    x = p["token_embedder"]["embedding"][dec_bt]
    mem = np.asarray(hidden_bsd, np.float64)
    for i in range(cfg.num_decoder_layers):
        lp = dp[f"layers_{i}"]
        x = x + attn(
            lp["self_attention"],
            norm(x, lp["pre_self_attention_layer_norm"]["scale"]),
            norm(x, lp["pre_self_attention_layer_norm"]["scale"]),
            self_bias[None],
        )
        x = x + attn(
            lp["encoder_decoder_attention"], norm(x, lp["pre_cross_attention_layer_norm"]["scale"]), mem, cross_bias
        )
        y = norm(x, lp["pre_mlp_layer_norm"]["scale"])
        m = lp["mlp"]
        if cfg.gated_gelu:
            a = y @ m["wi_0"]["kernel"]
            gelu = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))
            y = (gelu * (y @ m["wi_1"]["kernel"])) @ m["wo"]["kernel"]
        else:
            y = np.maximum(y @ m["wi"]["kernel"], 0) @ m["wo"]["kernel"]
        x = x + y
    y = norm(x, dp["decoder_norm"]["scale"])
    if cfg.logits_via_embedding:
        return y @ p["token_embedder"]["embedding"].T / np.sqrt(cfg.d_model)
    return y @ dp["logits_dense"]["kernel"]


@pytest.mark.parametrize("k,advance", [(4, (4, 1)), (5, (2, 5)), (1, (1, 1))])
def test_windows_at_mixed_positions_match_numpy_reference(setup, k, advance):
    """Windows at per-row positions (rows advancing by different amounts, rolled-back garbage in between)
    against a float64 numpy decoder computed from the parameters alone (not through ``t5.decode``)."""
    cfg, model, encoded, dec, _ = setup
    rng = np.random.default_rng(0)
    enc = rng.integers(3, cfg.vocab_size, size=(2, 9)).astype(np.int32)
    enc[0, 6:] = 0  # the fixture's encoder input (same generator, same first draw)
    hidden = np.asarray(t5.encoder_outputs(cfg, model.params, enc))
    want = _np_decoder(cfg, model.params, hidden, enc != 0, dec)
    got, _ = run_schedule(cfg, model, encoded, dec, k, advance=list(advance))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_cache_and_encoded_layout(setup):
    """Per-layer arrays, heads first: cache [b, n, L, h], cross keys [b, n, h, s] (the contracted head dim
    first, as the scores' dot reads them), cross values [b, n, s, h]; one axis name per dim."""
    cfg, model, encoded, _, _ = setup
    cache = t5.init_cache(cfg, 2, 13)
    assert len(cache.k) == len(cache.v) == cfg.num_decoder_layers
    assert {x.shape for x in cache.k + cache.v} == {(2, cfg.num_heads, 13, cfg.head_dim)}
    assert {x.shape for x in encoded.cross_k} == {(2, cfg.num_heads, cfg.head_dim, 9)}
    assert {x.shape for x in encoded.cross_v} == {(2, cfg.num_heads, 9, cfg.head_dim)}
    assert t5.ENCODED_AXES.cross_k == ("batch", "heads", "kv", "length")
    for tree in (cache, encoded):
        axes = t5.logical_axes(tree)
        leaves = jax.tree_util.tree_leaves(tree)
        names = jax.tree_util.tree_leaves(axes, is_leaf=lambda a: isinstance(a, tuple) and isinstance(a[0], str))
        assert [len(a) for a in names] == [x.ndim for x in leaves]


@pytest.mark.parametrize("longest", [1, 5, 16, 17, 30, 40])
def test_run_time_encoder_width_equals_whole_width(setup, longest):
    """``T5Decoding.encode`` runs the encoder on the smallest width of ``ENCODE_WIDTHS`` that holds the
    call's longest row (one ``lax.switch`` branch per width): its cross keys/values equal ``t5.encode`` on
    the whole padded width at every real position up to float32 rounding (rtol 1e-5, atol 1e-6: masked keys get
    exactly zero weight, only reduction orders differ), are zero
    past the width, and the decoder's logits agree (ATOL)."""
    from specjax.models.adapter import ENCODE_WIDTHS, T5Decoding, run_time_widths

    cfg, model, _, dec, _ = setup
    s = 48
    rng = np.random.default_rng(longest)
    enc = np.zeros((3, s), np.int32)
    for i, n in enumerate([longest, max(1, longest // 2), 1]):
        enc[i, :n] = rng.integers(3, cfg.vocab_size, size=n)
    whole = t5.encode(cfg, model.params, enc)
    dm = T5Decoding(cfg)
    assert dm.encode_widths == ENCODE_WIDTHS
    ran = jax.jit(dm.encode)(model.params, enc)
    assert run_time_widths(ENCODE_WIDTHS, s) == [16, 32, 48]
    assert run_time_widths(ENCODE_WIDTHS, 512) == [64, 128, 256, 512]
    width = min(w for w in run_time_widths(ENCODE_WIDTHS, s) if w >= longest)
    # Keys [b, n, h, s] are compared as [b, n, s, h], like the values.
    for a, c in zip(
        [np.swapaxes(x, 2, 3) for x in whole.cross_k] + list(whole.cross_v),
        [np.swapaxes(x, 2, 3) for x in ran.cross_k] + list(ran.cross_v),
    ):
        assert a.shape == c.shape == (3, cfg.num_heads, s, cfg.head_dim)
        real = (enc != 0)[:, None, :, None]
        np.testing.assert_allclose(np.where(real, c, 0), np.where(real, a, 0), rtol=1e-5, atol=1e-6)
        assert not np.any(np.asarray(c)[:, :, width:])
    np.testing.assert_array_equal(ran.mask, enc != 0)
    cache = t5.init_cache(cfg, 3, T)
    tokens = np.broadcast_to(dec[:1, :4], (3, 4))
    la, _ = _decode(cfg, model.params, whole, tokens, cache, np.zeros(3, np.int32))
    lc, _ = _decode(cfg, model.params, ran, tokens, cache, np.zeros(3, np.int32))
    np.testing.assert_allclose(lc, la, atol=ATOL)
    # One program holds every width below s and s itself.
    hlo = jax.jit(dm.encode).lower(model.params, enc).as_text()
    assert "case" in hlo or "conditional" in hlo


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_float32_attention_memory_gives_the_same_logits_bit_for_bit(setup, dtype):
    """A bfloat16 / float16 model's decoder with its self-attention cache and cross-attention keys/values held
    in float32 (``T5Decoding(kv_dtype="float32")``, what ``T5Model.decoding_model()`` picks on CPU): every
    window's logits equal those of the compute-dtype memory bit for bit, over windows of mixed sizes at
    per-row positions (stale slots written and masked), and the float32 cache holds exactly the compute-dtype
    cache's values. ``decoding_model()`` picks float32 for low-precision models only."""
    from specjax.models.adapter import T5Decoding

    cfg, model, _, dec, _ = setup
    low = model.astype(dtype)
    enc = np.asarray(np.random.default_rng(5).integers(3, cfg.vocab_size, size=(2, 9)), np.int32)
    enc[1, 4:] = 0
    plain, wide = T5Decoding(low.config), T5Decoding(low.config, kv_dtype="float32")
    step = jax.jit(lambda dm, p, e, t, c, pos: dm.decode(p, e, t, c, pos), static_argnums=0)
    memories = [jax.jit(dm.encode)(low.params, enc) for dm in (plain, wide)]
    assert memories[0].cross_k[0].dtype == jnp.dtype(dtype) and memories[1].cross_k[0].dtype == jnp.float32
    caches = [plain.init_cache(2, T + 8), wide.init_cache(2, T + 8)]
    assert caches[1].k[0].dtype == jnp.float32
    pos = np.zeros(2, np.int32)
    rng = np.random.default_rng(0)
    for k, advance in [(1, (1, 1)), (4, (2, 4)), (3, (3, 1)), (6, (1, 5)), (2, (2, 2))]:
        window = np.asarray(rng.integers(2, cfg.vocab_size, size=(2, k)), np.int32)
        out = []
        for i, dm in enumerate((plain, wide)):
            logits, caches[i] = step(dm, low.params, memories[i], window, caches[i], pos)
            out.append(np.asarray(logits))
        assert out[0].dtype == np.float32 and np.isfinite(out[0]).all()
        np.testing.assert_array_equal(out[1], out[0])
        pos = pos + np.asarray(advance, np.int32)
    for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a, np.float32))
    assert low.decoding_model()[0].kv_dtype == "float32"
    assert model.decoding_model()[0].kv_dtype is None

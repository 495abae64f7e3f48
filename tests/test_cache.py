"""The explicit KV cache: windowed decoding equals one uncached teacher-forced pass.

Decoding a sequence one token at a time (k=1), in windows of k=2..8, with rows at different positions
in the same call, and after stale garbage was written past a row's position and the row was rolled back,
must all give the logits of ``T5Model.logits`` (fp32, atol 1e-5). This is the contract the speculative
loop relies on (DESIGN.md, "The decode contract").
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from specjax import T5Config, T5Model
from specjax.models import t5

ATOL = 1e-5
T = 11  # decoder length
TINY = dict(vocab_size=50, d_model=16, num_heads=2, head_dim=8, mlp_dim=32, num_encoder_layers=2,
            num_decoder_layers=2, relative_attention_num_buckets=8, relative_attention_max_distance=16)
FAMILIES = {"t5_1_0": dict(gated_gelu=False, logits_via_embedding=True),
            "t5_1_1": dict(gated_gelu=True, logits_via_embedding=False)}


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
                window[i, :n] = dec[i, pos[i]:pos[i] + n]
        logits, cache = _decode(cfg, model.params, encoded, window, cache, pos)
        logits = np.asarray(logits)
        for i in range(b):
            n = min(advance[i], T - pos[i])
            if n > 0:
                out[i, pos[i]:pos[i] + n] = logits[i, :n]
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

"""The CPU compile options of the decode loops (specjax/decoding/xla_cpu.py): when they apply, that a user's
XLA_FLAGS wins, and that they change no output (the same tokens and counters with and without them)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import specjax
from specjax.config import T5Config
from specjax.decoding import xla_cpu

TINY = T5Config(
    vocab_size=48,
    d_model=16,
    num_heads=2,
    head_dim=8,
    mlp_dim=32,
    num_encoder_layers=1,
    num_decoder_layers=2,
    name="tiny",
)


def test_few_row_options_are_off_by_default(monkeypatch):
    """The default is the window-invariant path (XLA's defaults): docs/performance.md, "Window invariance"."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("SPECJAX_XLA_CPU_OPTIONS", raising=False)
    assert xla_cpu.cpu_compiler_options(1) is None
    assert xla_cpu.cpu_compiler_options(8, batch=1) is None


def test_options_only_for_few_rows_on_cpu(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setenv("SPECJAX_XLA_CPU_OPTIONS", xla_cpu.FEW_ROW_DOTS_MODE)
    assert jax.default_backend() == "cpu"
    assert xla_cpu.cpu_compiler_options(1) == dict(xla_cpu.SMALL_DOT_OPTIONS)
    assert xla_cpu.cpu_compiler_options(xla_cpu.SMALL_DOT_ROWS) == dict(xla_cpu.SMALL_DOT_OPTIONS)
    assert xla_cpu.cpu_compiler_options(xla_cpu.SMALL_DOT_ROWS + 1) is None
    # a batch of several rows keeps XLA's defaults (the encoder's b x s rows; the module docstring's A/B)
    assert xla_cpu.cpu_compiler_options(4, batch=xla_cpu.SMALL_DOT_BATCH) == dict(xla_cpu.SMALL_DOT_OPTIONS)
    assert xla_cpu.cpu_compiler_options(4, batch=xla_cpu.SMALL_DOT_BATCH + 1) is None
    # a bfloat16 target keeps XLA's defaults (YNNPACK's bfloat16 dots), at any row count
    import jax.numpy as jnp

    assert xla_cpu.cpu_compiler_options(1, jnp.bfloat16) is None
    assert xla_cpu.cpu_compiler_options(1, jnp.float32) == dict(xla_cpu.SMALL_DOT_OPTIONS)
    # the weights' dtype is the largest array's (a float32 norm scale beside bfloat16 kernels reads bfloat16)
    tree = {"scale": np.ones(4, np.float32), "kernel": jnp.ones((8, 8), jnp.bfloat16)}
    assert xla_cpu.weights_dtype(tree) == jnp.bfloat16
    assert xla_cpu.weights_dtype(specjax.T5Model.random(TINY, 0).params) == jnp.float32
    monkeypatch.setenv("SPECJAX_XLA_CPU_OPTIONS", "0")
    assert xla_cpu.cpu_compiler_options(1) is None


@pytest.mark.parametrize("flags", ["--xla_cpu_experimental_ynn_fusion_type=dot", "--xla_cpu_use_xnnpack=true"])
def test_a_users_xla_flags_win(monkeypatch, flags):
    monkeypatch.setenv("SPECJAX_XLA_CPU_OPTIONS", xla_cpu.FEW_ROW_DOTS_MODE)
    monkeypatch.setenv("XLA_FLAGS", flags)
    assert xla_cpu.cpu_compiler_options(1) is None


def test_same_tokens_and_counters_with_and_without_the_options(monkeypatch):
    target, draft = specjax.T5Model.random(TINY, 0), specjax.T5Model.random(TINY.replace(num_decoder_layers=1), 1)
    x = np.random.default_rng(0).integers(2, TINY.vocab_size, size=(3, 7)).astype(np.int32)
    x[1, 4:] = 0
    out = {}
    monkeypatch.setattr(xla_cpu, "SMALL_DOT_BATCH", 3)  # the options at this batch of 3 rows
    for setting in ("0", xla_cpu.FEW_ROW_DOTS_MODE):
        monkeypatch.setenv("SPECJAX_XLA_CPU_OPTIONS", setting)
        out[setting] = [
            jax.device_get(
                specjax.speculative_sample(target, draft, x, rng=5, gamma=3, max_decode_length=9, temperature=t)
            )
            for t in (0.0, 1.0)
        ]
        out[setting].append(
            jax.device_get(specjax.temperature_sample(target, x, rng=5, max_decode_length=9, temperature=0.0))
        )
    for a, b in zip(out["0"], out[xla_cpu.FEW_ROW_DOTS_MODE]):
        for leaf_a, leaf_b in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_allclose(leaf_a, leaf_b, rtol=1e-5)
    # Greedy speculative equals greedy target under the options too.
    few = out[xla_cpu.FEW_ROW_DOTS_MODE]
    np.testing.assert_array_equal(few[0].sequences, few[2].sequences)

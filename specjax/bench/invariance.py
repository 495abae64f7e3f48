"""Window invariance, measured: does a verification window give the logits the target alone's step gives?

Speculative sampling's greedy output equals the target alone's only if, at every position, the target's logits
from a window of γ + 1 tokens are the logits its one-token step gives (``decoding/baseline.py``,
``STEP_WINDOW``). ``window_step_mismatch`` feeds the same decoder tokens both ways, with the caches, window
sizes and XLA:CPU compile options the two loops use, and counts the logits that differ. Used by
``tests/test_window_invariance.py`` and ``benchmarks/accelerator_check.py`` (TPU / GPU, where the dot kernels
are the compiler's to pick).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding.baseline import STEP_WINDOW, decode_step
from specjax.decoding.inputs import target_cache_length
from specjax.decoding.model import as_decoding_model
from specjax.decoding.xla_cpu import cpu_compiler_options, program_platform, weights_dtype

__all__ = ["window_step_mismatch", "branch_step_mismatch"]


def window_step_mismatch(target, encoder_input_tokens, gamma: int, max_decode_length: int, seed: int = 0) -> dict:
    """Counts the logits that differ between a speculative loop's windows and the target alone's steps.

    Decoder inputs are ``T + γ + 1`` random token ids per row (``seed``). The target alone's way: one call per
    position ``i < T`` as ``temperature_sample`` makes it (``baseline.decode_step``: ``STEP_WINDOW`` tokens at
    batch 1, one token with ``STEP_WINDOW`` attention query rows from batch 2). The speculative way:
    windows of ``γ + 1`` tokens, the next window starting ``1 .. γ + 1`` positions later (drawn with ``seed``, as
    ragged acceptance would), each position's logits taken from the first window that emitted it. Caches as the
    loops make them (``target_cache_length``); each program compiled with the options its loop uses
    (``decoding/xla_cpu.py``) for the platform the parameters live on.

    Args:
      target: a ``T5Model`` or ``(DecodingModel, params)``.
      encoder_input_tokens: int32[b, s].
      gamma: γ >= 1. max_decode_length: ``T`` >= 1 (positions compared).
    Returns:
      dict: ``differ`` (logits that differ, of ``total`` = b x T x v), ``argmax_differ`` (positions whose argmax
      differs, of b x T), ``max_abs`` (largest absolute difference), ``dtype`` (the weights' dtype).
    Raises:
      ValueError: gamma or max_decode_length below 1.
    """
    if gamma < 1 or max_decode_length < 1:
        raise ValueError(f"gamma and max_decode_length must be >= 1, got {gamma} and {max_decode_length}.")
    fns, params = as_decoding_model(target, "target")
    x = jnp.asarray(encoder_input_tokens, jnp.int32)
    b, T = x.shape[0], max_decode_length
    dtype, platform = weights_dtype(params), program_platform(params)

    def compiled(rows):
        return jax.jit(fns.decode, compiler_options=cpu_compiler_options(rows, dtype, platform, b))

    tokens = jnp.asarray(np.random.default_rng(seed).integers(3, fns.vocab_size, (b, T + gamma + 1)), jnp.int32)
    encoded = jax.jit(fns.encode)(params, x)
    options = cpu_compiler_options(STEP_WINDOW * b, dtype, platform, b)
    step = jax.jit(functools.partial(decode_step, fns), compiler_options=options)  # as the loops run the step
    cache, steps = fns.init_cache(b, target_cache_length(T)), []
    for i in range(T):
        logits, cache = step(params, encoded, tokens[:, i : i + 1], cache, jnp.full((b,), i, jnp.int32))
        steps.append(np.asarray(logits))
    step_logits = np.stack(steps, 1)
    window, cache = compiled((gamma + 1) * b), fns.init_cache(b, target_cache_length(T, gamma))
    window_logits, n, ragged = np.zeros_like(step_logits), 0, np.random.default_rng(seed + 1)
    while n < T:
        logits, cache = window(params, encoded, tokens[:, n : n + gamma + 1], cache, jnp.full((b,), n, jnp.int32))
        emitted = min(int(ragged.integers(1, gamma + 2)), T - n)
        window_logits[:, n : n + emitted] = np.asarray(logits[:, :emitted])
        n += emitted
    diff = np.abs(window_logits - step_logits)
    return {
        "differ": int(np.sum(window_logits != step_logits)),
        "total": int(step_logits.size),
        "argmax_differ": int(np.sum(window_logits.argmax(-1) != step_logits.argmax(-1))),
        "max_abs": float(diff.max()),
        "dtype": jnp.dtype(dtype).name,
    }


def branch_step_mismatch(
    target, encoder_input_tokens, gamma: int, num_drafts: int, max_decode_length: int, seed: int = 0
) -> dict:
    """Counts the logits that differ between multi-draft branch windows and the target alone's steps.

    As ``window_step_mismatch``, with each window scored as ``num_drafts`` branches in one call
    (``decode_branches``): at each window one branch, drawn with ``seed``, holds the true next ``γ + 1`` decoder
    tokens and the others random ones (their first token too, as the draft's other candidates would be); the true
    branch's logits are compared with the steps' and its keys/values committed (``commit_branch``), as the loop
    commits the kept branch. Caches as the loops make them (``target_cache_length``).

    Args:
      target: a ``T5Model`` or ``(DecodingModel, params)`` (a model with ``decode_branches``).
      encoder_input_tokens: int32[b, s].
      gamma: γ >= 1. num_drafts: k >= 1 branches per window. max_decode_length: ``T`` >= 1 (positions compared).
    Returns:
      dict: ``differ``, ``total``, ``argmax_differ``, ``max_abs``, ``dtype`` as ``window_step_mismatch``.
    Raises:
      ValueError: gamma, num_drafts or max_decode_length below 1.
    """
    if gamma < 1 or num_drafts < 1 or max_decode_length < 1:
        raise ValueError(
            f"gamma, num_drafts and max_decode_length must be >= 1, got {gamma}, {num_drafts} and {max_decode_length}."
        )
    fns, params = as_decoding_model(target, "target")
    x = jnp.asarray(encoder_input_tokens, jnp.int32)
    b, T, k, w = x.shape[0], max_decode_length, num_drafts, gamma + 1
    dtype, platform = weights_dtype(params), program_platform(params)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, fns.vocab_size, (b, T + w))
    encoded = jax.jit(fns.encode)(params, x)
    step = jax.jit(fns.decode, compiler_options=cpu_compiler_options(STEP_WINDOW * b, dtype, platform, b))
    cache, steps = fns.init_cache(b, target_cache_length(T)), []
    for i in range(T):
        fed = jnp.tile(jnp.asarray(tokens[:, i : i + 1], jnp.int32), (1, STEP_WINDOW))
        logits, cache = step(params, encoded, fed, cache, jnp.full((b,), i, jnp.int32))
        steps.append(np.asarray(logits[:, 0]))
    step_logits = np.stack(steps, 1)
    options = cpu_compiler_options(k * w * b, dtype, platform, b)
    branches = jax.jit(fns.decode_branches, compiler_options=options)
    commit = jax.jit(fns.commit_branch, static_argnums=4)
    cache, n = fns.init_cache(b, target_cache_length(T, gamma)), 0
    branch_logits = np.zeros_like(step_logits)
    while n < T:
        window = rng.integers(3, fns.vocab_size, (b, k, w))
        window[:, :, 0] = tokens[:, n, None]  # every branch starts from the row's last token
        true = rng.integers(0, k, b)
        window[np.arange(b), true] = tokens[:, n : n + w]
        positions = jnp.full((b,), n, jnp.int32)
        logits, win = branches(params, encoded, jnp.asarray(window, jnp.int32), cache, positions)
        cache = commit(cache, win, jnp.asarray(true, jnp.int32), positions, w)
        emitted = min(int(rng.integers(1, w + 1)), T - n)
        branch_logits[:, n : n + emitted] = np.asarray(logits)[np.arange(b), true, :emitted]
        n += emitted
    diff = np.abs(branch_logits - step_logits)
    return {
        "differ": int(np.sum(branch_logits != step_logits)),
        "total": int(step_logits.size),
        "argmax_differ": int(np.sum(branch_logits.argmax(-1) != step_logits.argmax(-1))),
        "max_abs": float(diff.max()),
        "dtype": jnp.dtype(dtype).name,
    }

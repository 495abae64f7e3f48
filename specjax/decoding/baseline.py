"""The baseline: ``temperature_sample``, the target alone, one token per target call (t5x's name and loop).

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``T`` max_decode_length, ``v`` vocab.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specjax.decoding.drafts import decoder_input_at
from specjax.decoding.inputs import DecodeConfig, prepare_tokens, raw_keys, row_keys, split_rows, target_cache_length
from specjax.decoding.model import DecodingModel, as_decoding_model
from specjax.decoding.result import Counters, DecodeResult
from specjax.decoding.xla_cpu import TunedJit
from specjax.sampling import SamplingParams, argmax, sample_rows

__all__ = ["temperature_sample", "lower_temperature_sample", "STEP_WINDOW", "decode_step"]


STEP_WINDOW = 2
"""Tokens the target is fed per step: the row's next decoder input, then the same token again as filler.

A one-token call is a one-row dot at batch 1 (``x [1, d] @ W``), which XLA:CPU runs on another kernel than a
dot of two or more rows and which rounds differently (float32 and bfloat16; ``benchmarks/window_invariance.py``);
a speculative verification window always has ``γ + 1 >= 2`` rows. Fed two tokens, every step of the target
alone takes the window's numeric path, so its logits at a position are the window's bit for bit and greedy
speculative output equals this loop's token for token, on every dtype path. The filler's keys/values land in
the slot after the step's own (``target_cache_length(T)`` slots: in range), which the next step overwrites
before any query reads it; its logits are dropped. At batch 1 the cost is one more row per dot (the step reads
the same weights; ``docs/performance.md``, "Window invariance", has the measured cost). From batch 2 on the dense
dots have two or more rows anyway, so ``decode_step`` feeds the one token and only the attentions run
``STEP_WINDOW`` query rows (``t5.decode``'s ``query_rows``): the same logits at half the dense work."""


def decode_step(model: DecodingModel, params, encoded, token_b1, cache, positions):
    """One step of the target alone on the windows' numeric path (``STEP_WINDOW``): token int32[b, 1] at
    int32[b] -> (float32 logits [b, v] of the token, cache with its keys/values written at ``positions``).

    Batch 1, or a model whose ``decode`` has no ``query_rows``: the token and a filler copy are fed (a 2-token
    window; the filler's logits dropped, its cache slot overwritten by the next step). Batch >= 2 with
    ``query_rows``: the token alone through the projections, the MLP and the logits ([b, d] dots: b >= 2 rows),
    and ``STEP_WINDOW`` query rows in the attentions: bit for bit the same logits
    (``tests/test_window_invariance.py``) at about half the work of the filler.
    """
    b = token_b1.shape[0]
    if b >= 2 and getattr(model, "query_rows", False):
        logits, cache = model.decode(params, encoded, token_b1, cache, positions, query_rows=STEP_WINDOW)
    else:
        tokens = jnp.tile(token_b1, (1, STEP_WINDOW))  # [b, 2]: the input and a filler
        logits, cache = model.decode(params, encoded, tokens, cache, positions)
    return logits[:, 0], cache


class BaselineState(NamedTuple):
    """Carry of the baseline while loop.

    Attributes:
      cache: the target's cache; holds ``d[0..i-1]``.
      step: int32[] ``i``, the position fed next (all rows advance together; finished rows stop writing).
      sequences: int32[b, T]; done: bool[b]; keys: uint32[b, 2]; lengths: int32[b].
    """

    cache: Any
    step: jax.Array
    sequences: jax.Array
    done: jax.Array
    keys: jax.Array
    lengths: jax.Array


def sample_next(keys, logits, sampling: SamplingParams) -> jax.Array:
    """One token per row from logits float[b, v]: the argmax when every row is greedy (no probabilities
    built), else a draw from each row's warped distribution (one-hot for its greedy rows)."""
    return jax.lax.cond(
        sampling.all_greedy(), lambda _: argmax(logits), lambda _: sample_rows(keys, sampling.probs(logits)), None
    )


def _baseline_loop(
    model: DecodingModel, config: DecodeConfig, params, encoder_input_tokens, raw_key, sampling: SamplingParams
) -> DecodeResult:
    b = encoder_input_tokens.shape[0]
    T, pad_id = config.max_decode_length, model.pad_id
    with jax.named_scope("encode"):
        keys = row_keys(raw_key, b)
        encoded = model.encode(params, encoder_input_tokens)
    init = BaselineState(
        model.init_cache(b, target_cache_length(T)),  # the windows' cache length: one attention shape
        jnp.zeros((), jnp.int32),
        jnp.full((b, T), pad_id, jnp.int32),
        jnp.zeros((b,), bool),
        keys,
        jnp.zeros((b,), jnp.int32),
    )

    def body(state: BaselineState) -> BaselineState:
        i = state.step
        positions = jnp.full((b,), i, jnp.int32)
        with jax.named_scope("step"):
            token_b1 = decoder_input_at(state.sequences, positions, pad_id)[:, None]
            logits, cache = decode_step(model, params, encoded, token_b1, state.cache, positions)
        with jax.named_scope("sample"):
            next_keys, sample_keys = split_rows(state.keys, 2)
            token = sample_next(sample_keys, logits, sampling)
            active = ~state.done
            sequences = state.sequences.at[:, i].set(jnp.where(active, token, state.sequences[:, i]))
            done = state.done | (active & (token == config.eos_id)) | (i + 1 >= T)
        return BaselineState(cache, i + 1, sequences, done, next_keys, state.lengths + active.astype(jnp.int32))

    final = jax.lax.while_loop(lambda s: (s.step < T) & ~jnp.all(s.done), body, init)
    counters = Counters.zeros(b, 0)._replace(target_calls=final.lengths)
    return DecodeResult.from_loop(final.sequences, final.lengths, counters)


# Arguments: (model, config, params, tokens [b, s], key, sampling); STEP_WINDOW tokens per step: 2b rows per dot.
_baseline_jit = TunedJit(
    _baseline_loop, (0, 1), lambda *a: STEP_WINDOW * a[3].shape[0], lambda *a: a[2], lambda *a: a[3].shape[0]
)


def _baseline_args(
    model, encoder_input_tokens, rng, max_decode_length, temperature, top_k, top_p, eos_id, max_input_length, truncate
):
    fns, params = as_decoding_model(model, "model")
    config = DecodeConfig(max_decode_length, 0, eos_id)
    if config.eos_id >= fns.vocab_size:
        raise ValueError(
            f"eos_id={eos_id!r} is outside the vocabulary [0, {fns.vocab_size}); T5's SentencePiece EOS is 1."
        )
    tokens = prepare_tokens(
        encoder_input_tokens,
        vocab_size=fns.vocab_size,
        pad_id=fns.pad_id,
        eos_id=config.eos_id,
        max_input_length=max_input_length,
        truncate=truncate,
    )
    b = tokens.shape[0]
    return fns, config, params, tokens, raw_keys(rng, b), SamplingParams.broadcast(b, temperature, top_k, top_p)


def temperature_sample(
    model,
    encoder_input_tokens,
    *,
    rng=None,
    max_decode_length: int,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    eos_id: int = 1,
    max_input_length: int = 512,
    truncate: bool = False,
) -> DecodeResult:
    """Samples from the target alone, one token per target call (the baseline; t5x ``temperature_sample``).

    One jit-compiled ``lax.while_loop``: the input is encoded once, then decoded one token per step from the
    start token ``pad_id`` until every row has emitted EOS or ``max_decode_length`` tokens. Traceable (runs
    inside a user's ``jax.jit`` / ``shard_map`` / ``pmap``); static: ``max_decode_length``, ``eos_id``,
    ``max_input_length``, ``truncate``, the model's config and the input shape; traced: tokens, ``rng``,
    ``temperature``, ``top_k``, ``top_p``, parameters.

    Args:
      model: a ``T5Model``, or a ``(DecodingModel, params)`` pair.
      encoder_input_tokens: int[b, s] inputs, right-padded with ``pad_id``.
      rng: a PRNG key (row ``i`` uses ``fold_in(rng, i)``, so a row's sample does not depend on the rest of the
        batch), an int seed, per-row keys [b], or None (``PRNGKey(0)``).
      max_decode_length: ``T``, the most output tokens per row.
      temperature: float >= 0 or float[b] (0: greedy argmax). top_k: int >= 0 or int[b] (0: all).
      top_p: float in (0, 1] or float[b] (1: all).
      eos_id: the token that ends a row (kept in the output).
      max_input_length: the longest input accepted (tokens, padding excluded); 512 is T5's training length.
      truncate: cut longer inputs to ``max_input_length`` tokens (ending in EOS if they did) instead of raising.
    Returns:
      ``DecodeResult`` with ``sequences`` int32[b, T]; ``num_target_calls == lengths``; no drafts.
    Raises:
      ValueError (before anything compiles): empty batch, ids outside the vocabulary, input longer than
        ``max_input_length`` without ``truncate``, temperature < 0, top_k < 0, top_p outside (0, 1], eos_id
        outside the vocabulary, max_decode_length < 1, a bad rng (value checks skipped for traced values).
    """
    return _baseline_jit(
        *_baseline_args(
            model,
            encoder_input_tokens,
            rng,
            max_decode_length,
            temperature,
            top_k,
            top_p,
            eos_id,
            max_input_length,
            truncate,
        )
    )


def lower_temperature_sample(model, encoder_input_tokens, **kwargs) -> jax.stages.Lowered:
    """The lowered XLA program ``temperature_sample`` runs for these arguments (same keywords)."""
    kwargs = dict(
        dict(rng=None, temperature=1.0, top_k=0, top_p=1.0, eos_id=1, max_input_length=512, truncate=False), **kwargs
    )
    args = _baseline_args(model, encoder_input_tokens, kwargs.pop("rng"), kwargs.pop("max_decode_length"), **kwargs)
    return _baseline_jit.lower(*args)


def _check_baseline_arguments(model, encoder_input_tokens, **kwargs) -> None:
    """Every check ``temperature_sample`` makes, eagerly, compiling nothing (used by ``specjax.parallel``)."""
    kwargs = dict(
        dict(rng=None, temperature=1.0, top_k=0, top_p=1.0, eos_id=1, max_input_length=512, truncate=False), **kwargs
    )
    _baseline_args(model, encoder_input_tokens, kwargs.pop("rng"), kwargs.pop("max_decode_length"), **kwargs)


temperature_sample.check_arguments = _check_baseline_arguments

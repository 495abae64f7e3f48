"""The decode loops: ``temperature_sample`` (target alone) and ``speculative_sample`` (draft + target).

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``T`` max_decode_length, ``g`` gamma,
``k`` window (g + 1), ``v`` vocab, ``L`` cache length (T + g + 1).

Sources: Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
Algorithm 1 and section 2.3; Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
Sampling", Algorithm 2. The baseline follows t5x ``decoding.temperature_sample``.

Each call is one jit-compiled XLA program: a single top-level ``lax.while_loop`` whose body works on fixed
shapes; the gamma draft steps are a ``lax.scan`` nested in the body. Rows carry their own positions, keys,
done flags and counters, so every row accepts its own number of tokens per iteration.

The cache invariant (both models, per row, ``n`` = tokens emitted so far = ``positions``). The decoder
input sequence is ``d[0] = pad_id``, ``d[j] = sequences[j - 1]``; ``d[n]`` ("the last token") is fed at the
next call. Target: its cache holds ``d[0..n-1]`` at the start of an iteration; verification feeds the window
``[d[n], x_1..x_g]`` at positions ``n..n+g``, so after accepting ``a`` drafts the slots ``n..n+a`` hold
exactly ``d[n..n+a]`` and slots past ``n' = n + a + 1`` are stale (masked, later overwritten). Draft: its
cache holds ``d[0..n-2]`` (one slot less: after a full accept it never consumed ``x_g``), so its first step
each iteration is a 2-token window ``[d[n-1], d[n]]`` at positions ``n-1, n`` (at ``n = 0``: ``[d[0], d[0]]``
at ``0, 1``, the stale slot 1 being rewritten later), then ``g - 1`` one-token steps feed ``x_1..x_{g-1}``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models import t5
from specjax.sampling import Sampler, accept_or_resample, validate_sampling

__all__ = [
    "DecodeResult", "DecodingModel", "T5Decoding", "temperature_sample", "speculative_sample",
    "lower_temperature_sample", "lower_speculative_sample",
]

Params = Any
Cache = Any
Encoded = Any


# ----------------------------------------------------------------------------------------------------------
# The model as the loop sees it (STYLE.md item 4)


@runtime_checkable
class DecodingModel(Protocol):
    """The pure functions the loops call; a hashable object (frozen dataclass), static under ``jax.jit``.

    Parameters are passed separately (jit arguments, not closures). ``T5Decoding`` adapts ``specjax`` T5;
    tests implement it with hand-made logits.

    Attributes:
      vocab_size: ``v``.
      pad_id: padding of encoder inputs and the first decoder input token.
    """
    vocab_size: int
    pad_id: int

    def encode(self, params: Params, encoder_input_tokens: jax.Array) -> Encoded:
        """int32[b, s] -> a pytree the decoder reads (computed once per call)."""

    def decode(self, params: Params, encoded: Encoded, tokens: jax.Array, cache: Cache,
               positions: jax.Array) -> tuple[jax.Array, Cache]:
        """tokens int32[b, k] at per-row positions int32[b] -> (logits float[b, k, v], cache)."""

    def init_cache(self, batch: int, length: int) -> Cache:
        """An empty cache pytree for ``batch`` rows and ``length`` decoder positions."""


@dataclasses.dataclass(frozen=True)
class T5Decoding:
    """``DecodingModel`` for ``specjax.models.t5`` (the config is static; params are jit arguments)."""
    config: t5.T5Config

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def pad_id(self) -> int:
        return self.config.pad_id

    def encode(self, params, encoder_input_tokens):
        return t5.encode(self.config, params, encoder_input_tokens)

    def decode(self, params, encoded, tokens, cache, positions):
        return t5.decode(self.config, params, encoded, tokens, cache, positions)

    def init_cache(self, batch, length):
        return t5.init_cache(self.config, batch, length)


def _as_decoding_model(model, what: str) -> tuple[DecodingModel, Params]:
    if isinstance(model, t5.T5Model):
        return T5Decoding(model.config), model.params
    if isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], DecodingModel):
        return model
    raise ValueError(f"{what} must be a specjax T5Model or a (DecodingModel, params) pair, got "
                     f"{type(model).__name__}. Load one with specjax.load_checkpoint(path) or "
                     "T5Model.random(config).")


# ----------------------------------------------------------------------------------------------------------
# Results


@dataclasses.dataclass(frozen=True)
class DecodeResult:
    """What a decode returns (numpy arrays, on the host).

    Attributes:
      sequences: int32[b, T] output tokens (the decoder start token excluded), ``pad_id``-padded after the
        row's first EOS (which is kept) or up to ``max_decode_length``.
      lengths: int32[b] tokens per row, EOS included.
      num_target_calls: int32[b] target forward calls while the row was unfinished (the baseline: one per
        token; speculative: one per iteration).
      num_draft_tokens: int32[b] drafted tokens that could have been kept, summed over the iterations where
        the row was unfinished: per iteration ``min(gamma, room left, index of the first drafted EOS)``;
        drafts past the length budget or past a drafted EOS are not counted (they can never be emitted).
        0 for the baseline.
      num_accepted: int32[b] of those, the ones the acceptance rule kept.
    """
    sequences: np.ndarray
    lengths: np.ndarray
    num_target_calls: np.ndarray
    num_draft_tokens: np.ndarray
    num_accepted: np.ndarray

    @property
    def acceptance_rate(self) -> float:
        """alpha over the whole batch: sum(num_accepted) / sum(num_draft_tokens); NaN if nothing drafted."""
        drafted = int(np.sum(self.num_draft_tokens))
        return float(np.sum(self.num_accepted)) / drafted if drafted else float("nan")

    @property
    def tokens_per_target_call(self) -> float:
        """sum(lengths) / sum(num_target_calls) over the batch (1.0 for the baseline); NaN if no calls."""
        calls = int(np.sum(self.num_target_calls))
        return float(np.sum(self.lengths)) / calls if calls else float("nan")


# ----------------------------------------------------------------------------------------------------------
# Validation (Python, before anything compiles)


@dataclasses.dataclass(frozen=True)
class _Settings:
    """Static loop settings (hashable; part of the jit cache key)."""
    max_decode_length: int
    gamma: int
    sampler: Sampler
    eos_id: int


def _check_int(name, value, minimum, hint):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}; {hint}")
    return int(value)


def _prepare_inputs(encoder_input_tokens, vocab_size, pad_id, max_input_length, truncate, eos_id):
    arr = np.asarray(encoder_input_tokens)
    if arr.ndim == 1:
        raise ValueError(f"encoder_input_tokens must be 2-D [batch, length], got shape {arr.shape}; "
                         "for one input use tokens[None, :].")
    if arr.ndim != 2:
        raise ValueError(f"encoder_input_tokens must be 2-D [batch, length], got shape {arr.shape}.")
    if arr.shape[0] == 0:
        raise ValueError("encoder_input_tokens is an empty batch (0 rows); pass at least one input.")
    if arr.shape[1] == 0:
        raise ValueError("encoder_input_tokens has length 0; every input needs at least one token "
                         "(T5 inputs end with EOS).")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"encoder_input_tokens must hold integer token ids, got dtype {arr.dtype}.")
    if arr.min() < 0 or arr.max() >= vocab_size:
        raise ValueError(f"encoder_input_tokens holds ids outside the vocabulary [0, {vocab_size}): min "
                         f"{arr.min()}, max {arr.max()}. Was it encoded with the models' tokenizer?")
    max_input_length = _check_int("max_input_length", max_input_length, 1,
                                  "it bounds the encoder input length (T5 was trained with 512).")
    real = arr != pad_id
    lengths = np.where(real.any(axis=1), arr.shape[1] - np.argmax(real[:, ::-1], axis=1), 0)
    too_long = lengths > max_input_length
    if too_long.any():
        if not truncate:
            row = int(np.argmax(too_long))
            raise ValueError(
                f"input row {row} has {int(lengths[row])} tokens, more than max_input_length="
                f"{max_input_length}; pass truncate=True to keep the first {max_input_length} tokens "
                "(ending in EOS), or raise max_input_length if the models handle longer inputs.")
        ends_in_eos = arr[np.arange(arr.shape[0]), np.maximum(lengths - 1, 0)] == eos_id
        arr = arr[:, :max_input_length].copy()
        # seqio-style trim: keep EOS as the last token of a truncated input that ended in EOS.
        fix = too_long & ends_in_eos
        arr[fix, max_input_length - 1] = eos_id
    return arr.astype(np.int32)


def _row_keys(rng, batch: int) -> np.ndarray:
    """Per-row raw keys uint32[b, 2]: ``fold_in(rng, row)`` for one key, or the given [b] keys."""
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        rng = jax.random.PRNGKey(int(rng))
    rng = jnp.asarray(rng)
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.key_data(rng)
    if rng.dtype != jnp.uint32 or rng.ndim not in (1, 2) or rng.shape[-1] != 2:
        raise ValueError(f"rng must be a PRNG key (jax.random.key / PRNGKey), an int seed, or one key per "
                         f"row, got dtype {rng.dtype} shape {rng.shape}.")
    if rng.ndim == 2:
        if rng.shape[0] != batch:
            raise ValueError(f"rng holds {rng.shape[0]} per-row keys for a batch of {batch}; pass one key "
                             "(rows get fold_in(key, row)) or exactly one key per row.")
        return rng
    return _fold_rows(rng, batch)


@functools.partial(jax.jit, static_argnums=1)
def _fold_rows(rng, batch: int):
    # One compiled call instead of a handful of eager dispatches (~3 ms per decode call on CPU).
    return jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(batch))


def _validate_common(vocab_size, rng, max_decode_length, temperature, top_k, top_p, eos_id):
    validate_sampling(temperature, top_k, top_p)
    max_decode_length = _check_int("max_decode_length", max_decode_length, 1,
                                   "it is the most output tokens per row.")
    if isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer)) or not 0 <= eos_id < vocab_size:
        raise ValueError(f"eos_id={eos_id!r} is outside the vocabulary [0, {vocab_size}); T5's SentencePiece "
                         "EOS is 1.")
    return max_decode_length


# ----------------------------------------------------------------------------------------------------------
# Loop state (STYLE.md item 3: what the models see is the caches; the rest is loop bookkeeping)


class _Counters(NamedTuple):
    """Per-row counters, int32[b] each; see ``DecodeResult``."""
    target_calls: jax.Array
    draft_tokens: jax.Array
    accepted: jax.Array


class _SpecState(NamedTuple):
    """Carry of the speculative while loop.

    Attributes:
      target_cache: target ``Cache`` [.., b, L, ..]; holds ``d[0..n-1]`` (module docstring).
      draft_cache: draft ``Cache``; holds ``d[0..n-2]`` (the first draft step re-feeds ``d[n-1]``).
      positions: int32[b] ``n``: tokens emitted so far; ``d[n]`` is the next decoder input.
      sequences: int32[b, T] emitted tokens, pad after the row's end.
      done: bool[b] finished (EOS emitted or T reached); finished rows stop changing.
      keys: uint32[b, 2] per-row PRNG keys, split once per iteration.
      counters: ``_Counters``.
    """
    target_cache: Cache
    draft_cache: Cache
    positions: jax.Array
    sequences: jax.Array
    done: jax.Array
    keys: jax.Array
    counters: _Counters


class _BaselineState(NamedTuple):
    """Carry of the baseline while loop.

    Attributes:
      cache: target ``Cache``; holds ``d[0..i-1]``.
      step: int32[] ``i``, the position fed next (all rows advance together; finished rows stop writing).
      sequences: int32[b, T]; done: bool[b]; keys: uint32[b, 2]; lengths: int32[b].
    """
    cache: Cache
    step: jax.Array
    sequences: jax.Array
    done: jax.Array
    keys: jax.Array
    lengths: jax.Array


def _decoder_input_at(sequences, j, pad_id):
    """d[j] per row: ``pad_id`` at j = 0, else ``sequences[j - 1]``. sequences [b, T], j int32[b] -> [b]."""
    prev = jnp.take_along_axis(sequences, jnp.maximum(j - 1, 0)[:, None], axis=1)[:, 0]
    return jnp.where(j == 0, pad_id, prev).astype(jnp.int32)


def _split_rows(keys, num):
    """keys uint32[b, 2] -> uint32[num, b, 2] (vmapped split, so each row only uses its own key)."""
    return jnp.swapaxes(jax.vmap(lambda k: jax.random.split(k, num))(keys), 0, 1)


# ----------------------------------------------------------------------------------------------------------
# The baseline: temperature_sample


def _baseline_loop(fns: DecodingModel, settings: _Settings, params, encoder_input_tokens, keys):
    b = encoder_input_tokens.shape[0]
    T, sampler, pad_id = settings.max_decode_length, settings.sampler, fns.pad_id
    with jax.named_scope("encode"):
        encoded = fns.encode(params, encoder_input_tokens)
    init = _BaselineState(
        cache=fns.init_cache(b, T + 1), step=jnp.zeros((), jnp.int32),
        sequences=jnp.full((b, T), pad_id, jnp.int32), done=jnp.zeros((b,), bool), keys=keys,
        lengths=jnp.zeros((b,), jnp.int32))

    def cond(state: _BaselineState):
        return (state.step < T) & ~jnp.all(state.done)

    def body(state: _BaselineState):
        i = state.step
        positions = jnp.full((b,), i, jnp.int32)
        tokens = _decoder_input_at(state.sequences, positions, pad_id)[:, None]  # [b, 1]
        with jax.named_scope("target"):
            logits, cache = fns.decode(params, encoded, tokens, state.cache, positions)
        with jax.named_scope("sample"):
            next_keys, step_keys = _split_rows(state.keys, 2)
            if sampler.greedy:  # argmax of the logits: no [b, v] one-hot built
                token = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
            else:
                probs = sampler.probs(logits[:, 0])  # [b, v]
                token = jax.vmap(sampler.sample)(step_keys, probs)  # [b]
        active = ~state.done
        sequences = state.sequences.at[:, i].set(jnp.where(active, token, state.sequences[:, i]))
        done = state.done | (active & (token == settings.eos_id)) | (i + 1 >= T)
        return _BaselineState(cache, i + 1, sequences, done, next_keys,
                              state.lengths + active.astype(jnp.int32))

    final = jax.lax.while_loop(cond, body, init)
    zeros = jnp.zeros((b,), jnp.int32)
    return final.sequences, final.lengths, _Counters(final.lengths, zeros, zeros)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _baseline_jit(fns, settings, params, encoder_input_tokens, keys):
    return _baseline_loop(fns, settings, params, encoder_input_tokens, keys)


# ----------------------------------------------------------------------------------------------------------
# Speculative sampling


def _speculative_loop(target: DecodingModel, draft: DecodingModel, settings: _Settings, target_params,
                      draft_params, encoder_input_tokens, keys):
    b = encoder_input_tokens.shape[0]
    T, g, sampler, eos = settings.max_decode_length, settings.gamma, settings.sampler, settings.eos_id
    pad_id = target.pad_id
    rows = jnp.arange(b)
    with jax.named_scope("encode"):
        target_encoded = target.encode(target_params, encoder_input_tokens)
        draft_encoded = draft.encode(draft_params, encoder_input_tokens)
    cache_len = T + g + 1  # the verify window writes up to position n + g <= T + g
    zeros = jnp.zeros((b,), jnp.int32)
    init = _SpecState(
        target_cache=target.init_cache(b, cache_len), draft_cache=draft.init_cache(b, cache_len),
        positions=zeros, sequences=jnp.full((b, T), pad_id, jnp.int32), done=jnp.zeros((b,), bool),
        keys=keys, counters=_Counters(zeros, zeros, zeros))

    def cond(state: _SpecState):
        return ~jnp.all(state.done)

    def body(state: _SpecState):
        n = state.positions  # [b]
        last = _decoder_input_at(state.sequences, n, pad_id)  # d[n], [b]
        split = _split_rows(state.keys, g + 2)  # [g + 2, b, 2]
        next_keys, accept_keys, draft_keys = split[0], split[1], split[2:]  # draft_keys [g, b, 2]

        with jax.named_scope("draft"):
            # First step: window [d[n-1], d[n]] at n-1 (re-feeds a token the cache may lack after a full
            # accept); at n = 0 the window is [d[0], d[0]] at 0 and we read its first logits.
            start = jnp.maximum(n - 1, 0)
            first = _decoder_input_at(state.sequences, start, pad_id)
            logits2, draft_cache = draft.decode(draft_params, draft_encoded, jnp.stack([first, last], 1),
                                                state.draft_cache, start)  # logits2 [b, 2, v]

            def draw(key_b, logits_bv):
                # Greedy: the argmax straight from the logits (p is one-hot there; never materialised).
                if sampler.greedy:
                    return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32), jnp.zeros((b, 0), jnp.float32)
                p = sampler.probs(logits_bv)  # [b, v]
                return jax.vmap(sampler.sample)(key_b, p), p

            x1, p1 = draw(draft_keys[0], logits2[rows, n - start])  # [b], [b, v]

            def draft_step(carry, key_i):
                cache, x_prev, pos = carry  # x_prev [b] sits at decoder position pos [b]
                logits, cache = draft.decode(draft_params, draft_encoded, x_prev[:, None], cache, pos)
                x, p = draw(key_i, logits[:, 0])
                return (cache, x, pos + 1), (x, p)

            (draft_cache, _, _), (xs, ps) = jax.lax.scan(draft_step, (draft_cache, x1, n + 1), draft_keys[1:])
            drafted = jnp.concatenate([x1[:, None], jnp.swapaxes(xs, 0, 1)], axis=1)  # [b, g]
            p = jnp.concatenate([p1[:, None], jnp.swapaxes(ps, 0, 1)], axis=1)  # [b, g, v] ([b, g, 0] greedy)

        with jax.named_scope("verify"):
            window = jnp.concatenate([last[:, None], drafted], axis=1)  # [b, k]
            logits_q, target_cache = target.decode(target_params, target_encoded, window,
                                                   state.target_cache, n)  # [b, k, v]

        with jax.named_scope("accept"):
            if sampler.greedy:
                # accept_or_resample on one-hot p and q reduces to this (the residual of two one-hots is
                # the target's one-hot): keep drafts while they equal the target's argmax, then emit the
                # target's argmax at the first mismatch (or the bonus position).
                target_tokens = jnp.argmax(logits_q, axis=-1).astype(jnp.int32)  # [b, k]
                num_acc = jnp.sum(jnp.cumprod((target_tokens[:, :g] == drafted).astype(jnp.int32), axis=1),
                                  axis=1)
                next_token = target_tokens[rows, num_acc]
            else:
                q = sampler.probs(logits_q)  # [b, k, v]
                num_acc, next_token = jax.vmap(accept_or_resample)(accept_keys, drafted, p, q)  # [b], [b]
            j = jnp.arange(g + 1)[None, :]  # [1, k]
            drafted_pad = jnp.concatenate([drafted, jnp.zeros((b, 1), jnp.int32)], axis=1)  # [b, k]
            emitted = jnp.where(j < num_acc[:, None], drafted_pad, next_token[:, None])  # [b, k]
            count = num_acc + 1  # tokens emitted before EOS / room clipping, in [1, g + 1]
            is_eos = (emitted == eos) & (j < count[:, None])
            first_eos = jnp.where(is_eos.any(1), jnp.argmax(is_eos, axis=1) + 1, g + 2)  # 1-based
            room = T - n
            active = ~state.done
            kept = jnp.where(active, jnp.minimum(jnp.minimum(count, first_eos), room), 0)  # [b]
            idx = jnp.where(j < kept[:, None], n[:, None] + j, T)  # T is out of bounds: dropped
            sequences = state.sequences.at[rows[:, None], idx].set(emitted, mode="drop")
            new_n = n + kept
            done = state.done | (active & ((first_eos <= kept) | (new_n >= T)))

            # Counters: drafts that could have been kept (within room, up to the first drafted EOS).
            draft_is_eos = drafted == eos
            first_draft_eos = jnp.where(draft_is_eos.any(1), jnp.argmax(draft_is_eos, axis=1) + 1, g)
            useful = jnp.minimum(jnp.minimum(first_draft_eos, room), g)
            act = active.astype(jnp.int32)
            c = state.counters
            counters = _Counters(c.target_calls + act, c.draft_tokens + act * useful,
                                 c.accepted + act * jnp.minimum(num_acc, useful))

        return _SpecState(target_cache, draft_cache, new_n, sequences, done, next_keys, counters)

    final = jax.lax.while_loop(cond, body, init)
    return final.sequences, final.positions, final.counters


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _speculative_jit(target, draft, settings, target_params, draft_params, encoder_input_tokens, keys):
    return _speculative_loop(target, draft, settings, target_params, draft_params, encoder_input_tokens,
                             keys)


# ----------------------------------------------------------------------------------------------------------
# Public API


def _result(out) -> DecodeResult:
    sequences, lengths, counters = jax.device_get(out)
    return DecodeResult(np.asarray(sequences), np.asarray(lengths), np.asarray(counters.target_calls),
                        np.asarray(counters.draft_tokens), np.asarray(counters.accepted))


def _baseline_args(model, encoder_input_tokens, rng, max_decode_length, temperature, top_k, top_p, eos_id,
                   max_input_length, truncate):
    fns, params = _as_decoding_model(model, "model")
    T = _validate_common(fns.vocab_size, rng, max_decode_length, temperature, top_k, top_p, eos_id)
    tokens = _prepare_inputs(encoder_input_tokens, fns.vocab_size, fns.pad_id, max_input_length, truncate,
                             eos_id)
    keys = _row_keys(rng, tokens.shape[0])
    settings = _Settings(T, 0, Sampler(float(temperature), int(top_k), float(top_p)), int(eos_id))
    return fns, settings, params, jnp.asarray(tokens), keys


def temperature_sample(model, encoder_input_tokens, *, rng, max_decode_length: int,
                       temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, eos_id: int = 1,
                       max_input_length: int = 512, truncate: bool = False) -> DecodeResult:
    """Samples from the target alone, one token per target call (the baseline; t5x ``temperature_sample``).

    One jit-compiled ``lax.while_loop``; the model is encoded once, then decoded one token per step from
    the start token ``pad_id`` until every row has emitted EOS or ``max_decode_length`` tokens.

    Args:
      model: a ``T5Model``, or a ``(DecodingModel, params)`` pair.
      encoder_input_tokens: int[b, s] inputs, right-padded with ``pad_id``.
      rng: a PRNG key (row ``i`` uses ``fold_in(rng, i)``, so a row's sample does not depend on the rest of
        the batch), an int seed, or per-row keys [b].
      max_decode_length: ``T``, the most output tokens per row.
      temperature: >= 0; 0 is greedy (argmax).
      top_k: keep the k most likely tokens (0: all). top_p: nucleus mass in (0, 1] (1: all).
      eos_id: the token that ends a row (kept in the output).
      max_input_length: the longest input accepted (tokens, padding excluded); 512 is T5's training length.
      truncate: if True, longer inputs are cut to ``max_input_length`` tokens (ending in EOS if they did);
        if False they raise.
    Returns:
      ``DecodeResult`` with ``sequences`` int32[b, T]; ``num_target_calls == lengths``; no drafts.
    Raises:
      ValueError: empty batch, ids outside the vocabulary, input longer than ``max_input_length`` without
        ``truncate``, temperature < 0, top_k < 0, top_p outside (0, 1], eos_id outside the vocabulary,
        max_decode_length < 1 — all before anything compiles.
    """
    return _result(_baseline_jit(*_baseline_args(model, encoder_input_tokens, rng, max_decode_length,
                                                 temperature, top_k, top_p, eos_id, max_input_length,
                                                 truncate)))


def lower_temperature_sample(model, encoder_input_tokens, **kwargs) -> jax.stages.Lowered:
    """The lowered XLA program ``temperature_sample`` would run (same arguments); for inspection and tests."""
    defaults = dict(temperature=1.0, top_k=0, top_p=1.0, eos_id=1, max_input_length=512, truncate=False)
    defaults.update(kwargs)
    args = _baseline_args(model, encoder_input_tokens, defaults.pop("rng"), defaults.pop("max_decode_length"),
                          **defaults)
    return _baseline_jit.lower(*args)


def _speculative_args(target, draft, encoder_input_tokens, rng, gamma, max_decode_length, temperature, top_k,
                      top_p, eos_id, max_input_length, truncate):
    target_fns, target_params = _as_decoding_model(target, "target")
    draft_fns, draft_params = _as_decoding_model(draft, "draft")
    if target_fns.vocab_size != draft_fns.vocab_size:
        raise ValueError(
            f"draft vocabulary ({draft_fns.vocab_size} tokens) differs from the target's "
            f"({target_fns.vocab_size}); speculative sampling compares both models' probabilities token by "
            "token, so use a draft trained with the target's tokenizer and vocabulary size (all public T5 / "
            "T5 1.1 / Flan-T5 checkpoints use 32128).")
    if target_fns.pad_id != draft_fns.pad_id:
        raise ValueError(f"draft pad_id {draft_fns.pad_id} differs from the target's {target_fns.pad_id}; both "
                         "models must start decoding from the same token.")
    gamma = _check_int("gamma", gamma, 1, "it is the number of draft tokens per target call (try 3 to 7).")
    T = _validate_common(target_fns.vocab_size, rng, max_decode_length, temperature, top_k, top_p, eos_id)
    tokens = _prepare_inputs(encoder_input_tokens, target_fns.vocab_size, target_fns.pad_id, max_input_length,
                             truncate, eos_id)
    keys = _row_keys(rng, tokens.shape[0])
    settings = _Settings(T, gamma, Sampler(float(temperature), int(top_k), float(top_p)), int(eos_id))
    return target_fns, draft_fns, settings, target_params, draft_params, jnp.asarray(tokens), keys


def speculative_sample(target, draft, encoder_input_tokens, *, rng, gamma: int, max_decode_length: int,
                       temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, eos_id: int = 1,
                       max_input_length: int = 512, truncate: bool = False) -> DecodeResult:
    """Speculative sampling: the draft proposes ``gamma`` tokens, the target checks them in one call.

    Leviathan et al. 2023, Algorithm 1 (Chen et al. 2023, Algorithm 2) for encoder-decoders: each model
    encodes the input once; each loop iteration, per row, the draft samples ``x_1..x_g`` from ``p_1..p_g``,
    the target scores ``[last, x_1..x_g]`` in one call giving ``q_1..q_{g+1}``, ``x_i`` is accepted while
    ``r_i < min(1, q_i(x_i)/p_i(x_i))``, and the first rejection is replaced by a sample from
    ``norm(max(0, q_i - p_i))`` (or, if all are accepted, a bonus token from ``q_{g+1}``). So each iteration
    emits 1 to g + 1 tokens per unfinished row, and the output has exactly the target's distribution under
    the same warping (temperature / top-k / top-p are applied to both p and q). At temperature 0 the output
    equals target-greedy ``temperature_sample`` token for token.

    One jit-compiled XLA program: a single top-level ``lax.while_loop`` (the draft steps a ``lax.scan`` in
    its body), fixed shapes, no host callbacks. Rows keep their own positions and stop changing after
    EOS (kept; the row ends at its first accepted EOS, even mid-window) or ``max_decode_length`` tokens.

    Args:
      target, draft: ``T5Model``s (or ``(DecodingModel, params)`` pairs) with the same vocabulary.
      encoder_input_tokens: int[b, s] inputs, right-padded with ``pad_id``.
      rng: a PRNG key (row ``i`` uses ``fold_in(rng, i)``), an int seed, or per-row keys [b].
      gamma: draft tokens per iteration (>= 1); it may exceed the room left, the loop clips.
      max_decode_length: ``T``, the most output tokens per row.
      temperature, top_k, top_p: the warping, as in ``temperature_sample``.
      eos_id: the token that ends a row.
      max_input_length, truncate: as in ``temperature_sample``.
    Returns:
      ``DecodeResult``: ``sequences`` int32[b, T], ``lengths``, and per row ``num_target_calls`` (loop
      iterations while unfinished), ``num_draft_tokens``, ``num_accepted`` (see ``DecodeResult``).
    Raises:
      ValueError (before anything compiles): draft and target vocabularies differ; gamma < 1; plus every
        error of ``temperature_sample``.
    """
    return _result(_speculative_jit(*_speculative_args(target, draft, encoder_input_tokens, rng, gamma,
                                                       max_decode_length, temperature, top_k, top_p, eos_id,
                                                       max_input_length, truncate)))


def lower_speculative_sample(target, draft, encoder_input_tokens, **kwargs) -> jax.stages.Lowered:
    """The lowered XLA program ``speculative_sample`` would run (same arguments); for inspection and tests."""
    defaults = dict(temperature=1.0, top_k=0, top_p=1.0, eos_id=1, max_input_length=512, truncate=False)
    defaults.update(kwargs)
    args = _speculative_args(target, draft, encoder_input_tokens, defaults.pop("rng"), defaults.pop("gamma"),
                             defaults.pop("max_decode_length"), **defaults)
    return _speculative_jit.lower(*args)


# ----------------------------------------------------------------------------------------------------------
# Lower-level entry point for specjax.parallel (jit with shardings, shard_map); added by the parallel issue.


class DecodeProgram(NamedTuple):
    """A validated decode call split into static settings and array arguments, for wrapping the loop.

    ``decode_result(jax.jit(decode_loop, static_argnums=(0, 1))(*program))`` is exactly what
    ``temperature_sample`` / ``speculative_sample`` compute; ``specjax.parallel`` instead runs
    ``decode_loop`` under ``jax.shard_map`` or a sharded ``jax.jit``.

    Attributes:
      models: ``(target,)`` for the baseline or ``(target, draft)``: ``DecodingModel``s (static, hashable).
      settings: static loop settings (max_decode_length, gamma, sampler, eos_id), hashable.
      params: parameter pytrees, one per model, same order.
      encoder_input_tokens: int32[b, s] validated inputs.
      keys: uint32[b, 2] per-row PRNG keys; row ``i``'s output depends only on its input row and key, so
        rows may be split, padded or reordered across devices.
    """
    models: tuple
    settings: Any
    params: tuple
    encoder_input_tokens: jax.Array
    keys: jax.Array


def decode_loop(models, settings, params, encoder_input_tokens, keys):
    """The pure, traceable decode loop of a ``DecodeProgram`` (no jit of its own).

    Args:
      models, settings: static (``DecodeProgram.models`` / ``.settings``); models may be replaced by
        wrappers with the same ``DecodingModel`` interface (e.g. adding sharding constraints).
      params: tuple of parameter pytrees, one per model.
      encoder_input_tokens: int32[b, s]. keys: uint32[b, 2].
    Returns:
      (sequences int32[b, T], lengths int32[b], counters: 3 x int32[b]); pass to ``decode_result``.
    """
    if len(models) == 1:
        return _baseline_loop(models[0], settings, params[0], encoder_input_tokens, keys)
    return _speculative_loop(models[0], models[1], settings, params[0], params[1], encoder_input_tokens, keys)


def decode_result(outputs) -> DecodeResult:
    """``decode_loop`` outputs (device or host arrays) -> ``DecodeResult`` of numpy arrays."""
    return _result(outputs)


def temperature_sample_program(model, encoder_input_tokens, **kwargs) -> DecodeProgram:
    """Validates ``temperature_sample``'s arguments (same keywords) into a ``DecodeProgram``; compiles nothing.

    Raises:
      ValueError: as ``temperature_sample``.
    """
    defaults = dict(temperature=1.0, top_k=0, top_p=1.0, eos_id=1, max_input_length=512, truncate=False)
    defaults.update(kwargs)
    fns, settings, params, tokens, keys = _baseline_args(
        model, encoder_input_tokens, defaults.pop("rng"), defaults.pop("max_decode_length"), **defaults)
    return DecodeProgram((fns,), settings, (params,), tokens, keys)


def speculative_sample_program(target, draft, encoder_input_tokens, **kwargs) -> DecodeProgram:
    """Validates ``speculative_sample``'s arguments (same keywords) into a ``DecodeProgram``; compiles nothing.

    Raises:
      ValueError: as ``speculative_sample``.
    """
    defaults = dict(temperature=1.0, top_k=0, top_p=1.0, eos_id=1, max_input_length=512, truncate=False)
    defaults.update(kwargs)
    target_fns, draft_fns, settings, target_params, draft_params, tokens, keys = _speculative_args(
        target, draft, encoder_input_tokens, defaults.pop("rng"), defaults.pop("gamma"),
        defaults.pop("max_decode_length"), **defaults)
    return DecodeProgram((target_fns, draft_fns), settings, (target_params, draft_params), tokens, keys)

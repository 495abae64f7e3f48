"""Everything a decode call checks and prepares before the compiled loop: one place, used by the samplers,
the CLI, the bench and the peer comparisons.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length.

Validation survives tracing (t5x ``decoding.py``'s ``_is_tracer`` pattern, STYLE.md item 13): shapes, dtypes
and static settings are always checked; checks that need values (token ids in the vocabulary, input
lengths, sampling ranges) run only when the value is concrete. So the samplers give friendly errors when
called eagerly and still work inside a user's ``jax.jit`` / ``shard_map`` / ``pmap``.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "DecodeConfig",
    "VERIFICATIONS",
    "MAX_DRAFTS",
    "is_tracer",
    "check_int",
    "prepare_tokens",
    "raw_keys",
    "row_keys",
    "split_rows",
    "bucket_length",
    "pad_batch",
    "batches",
]

MAX_DRAFTS = 4
"""The most draft continuations ``speculative_sample(..., num_drafts=k)`` verifies per target call."""

VERIFICATIONS = ("token", "block")
"""Verifiers the speculative loop knows: token (Leviathan et al. 2023, Alg. 1), block (Sun et al. 2025)."""


def is_tracer(x) -> bool:
    """True for a value traced by ``jax.jit`` / ``vmap`` / ``shard_map`` (its value is unknown)."""
    return isinstance(x, jax.core.Tracer)


def check_int(name: str, value, minimum: int, hint: str) -> int:
    """A static Python / NumPy integer ``>= minimum`` as ``int``; else ValueError naming ``name`` and ``hint``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}; {hint}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """The static part of a decode call: hashable, part of the compiled program's cache key.

    Everything else (tokens, keys, temperature, top-k, top-p) is a traced array, so one compiled program
    serves every value of those. Changing a field here compiles a new program (on this project's 2-core CPU,
    ~10-30 s for the shipped pair on a 2-core CPU; on TPU tens of seconds for T5-XXL).

    Attributes:
      max_decode_length: ``T``, the most output tokens per row (tokens).
      gamma: draft tokens per iteration (``γ``); 0 for the baseline. A gamma above ``max_decode_length`` is
        clipped to it (no iteration could use more drafts; a huge window would only cost time).
      eos_id: the token that ends a row (kept in the output). T5's SentencePiece EOS is 1.
      verification: "token" (Leviathan et al. 2023, Algorithm 1) or "block" (Sun et al. 2025).
      num_drafts: draft continuations verified per target call (1 to ``MAX_DRAFTS`` = 4; 1 is single-draft
        speculative sampling; ``specjax.decoding.branches``).
    Raises:
      ValueError: a field out of range, with the way out in the message.
    """

    max_decode_length: int
    gamma: int = 0
    eos_id: int = 1
    verification: str = "token"
    num_drafts: int = 1

    def __post_init__(self):
        check_int("max_decode_length", self.max_decode_length, 1, "it is the most output tokens per row.")
        check_int("gamma", self.gamma, 0, "it is the number of draft tokens per target call (try 3 to 7).")
        if (
            isinstance(self.eos_id, (bool, np.bool_))
            or not isinstance(self.eos_id, (int, np.integer))
            or self.eos_id < 0
        ):
            raise ValueError(f"eos_id={self.eos_id!r} is outside the vocabulary; T5's SentencePiece EOS is 1.")
        if self.gamma > self.max_decode_length:  # more drafts than tokens can never be used: clip
            object.__setattr__(self, "gamma", int(self.max_decode_length))
        if self.verification not in VERIFICATIONS:
            raise ValueError(f"verification must be one of {VERIFICATIONS}, got {self.verification!r}.")
        if (
            isinstance(self.num_drafts, (bool, np.bool_))
            or not isinstance(self.num_drafts, (int, np.integer))
            or not 1 <= self.num_drafts <= MAX_DRAFTS
        ):
            raise ValueError(
                f"num_drafts must be an int in [1, {MAX_DRAFTS}], got {self.num_drafts!r}; it is the number of draft "
                "continuations the target checks per call (1: single-draft speculative sampling; try 2)."
            )
        object.__setattr__(self, "num_drafts", int(self.num_drafts))
        object.__setattr__(self, "max_decode_length", int(self.max_decode_length))
        object.__setattr__(self, "gamma", int(self.gamma))
        object.__setattr__(self, "eos_id", int(self.eos_id))


def prepare_tokens(
    encoder_input_tokens, *, vocab_size: int, pad_id: int, eos_id: int, max_input_length: int, truncate: bool
):
    """Checks ``encoder_input_tokens`` and cuts inputs longer than ``max_input_length`` when ``truncate``.

    Args:
      encoder_input_tokens: int[b, s] token ids right-padded with ``pad_id`` (NumPy, lists, or JAX arrays,
        traced or not).
      vocab_size, pad_id, eos_id: the models'.
      max_input_length: the longest input accepted (tokens, padding excluded).
      truncate: cut longer inputs to their first ``max_input_length`` tokens, the last one set to EOS when
        the input ended in EOS (seqio's trim); when False, a longer input raises (if concrete).
    Returns:
      int32[b, min(s, max_input_length)] (NumPy when the input was concrete host data, else a JAX array).
    Raises:
      ValueError: not 2-D, empty batch or length, non-integer dtype; when concrete: ids outside the
        vocabulary, or an input longer than ``max_input_length`` without ``truncate``.
    """
    max_input_length = check_int(
        "max_input_length", max_input_length, 1, "it bounds the encoder input length (T5 was trained with 512)."
    )
    traced = is_tracer(encoder_input_tokens)
    if not traced and not isinstance(encoder_input_tokens, jax.Array):
        try:
            encoder_input_tokens = np.asarray(encoder_input_tokens)
        except ValueError:  # rows of different lengths
            raise ValueError(
                "encoder_input_tokens rows have different lengths; pad them into one int[batch, length] array "
                "(tokenizer.encode_batch(texts) does, padding with 0)."
            ) from None
        if encoder_input_tokens.dtype.kind in "USO" and any(
            isinstance(v, (str, bytes)) for v in encoder_input_tokens.reshape(-1)[:8]
        ):
            raise ValueError(
                "encoder_input_tokens look like text (strings), not token ids: tokenize first with "
                "tokenizer.encode_batch(texts) (int32[batch, length], padded with 0)."
            )
    shape, dtype = np.shape(encoder_input_tokens), encoder_input_tokens.dtype
    if len(shape) == 1:
        raise ValueError(
            f"encoder_input_tokens must be 2-D [batch, length], got shape {shape}; for one input use tokens[None, :]."
        )
    if len(shape) != 2:
        raise ValueError(f"encoder_input_tokens must be 2-D [batch, length], got shape {shape}.")
    if shape[0] == 0:
        raise ValueError("encoder_input_tokens is an empty batch (0 rows); pass at least one input.")
    if shape[1] == 0:
        raise ValueError(
            "encoder_input_tokens has length 0; every input needs at least one token (T5 inputs end with EOS)."
        )
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"encoder_input_tokens must hold integer token ids, got dtype {dtype}.")
    if not traced:
        arr = np.asarray(encoder_input_tokens)
        if arr.min() < 0 or arr.max() >= vocab_size:
            raise ValueError(
                f"encoder_input_tokens holds ids outside the vocabulary [0, {vocab_size}): min "
                f"{arr.min()}, max {arr.max()}. Was it encoded with the models' tokenizer?"
            )
        real = arr != pad_id
        lengths = np.where(real.any(axis=1), arr.shape[1] - np.argmax(real[:, ::-1], axis=1), 0)
        too_long = lengths > max_input_length
        if too_long.any() and not truncate:
            row = int(np.argmax(too_long))
            raise ValueError(
                f"input row {row} has {int(lengths[row])} tokens, more than max_input_length={max_input_length}; "
                f"pass truncate=True (CLI: --truncate) to keep the first {max_input_length} tokens (ending in "
                "EOS), or raise max_input_length if the models handle longer inputs."
            )
    if shape[1] <= max_input_length:
        return encoder_input_tokens.astype(np.int32) if not traced else encoder_input_tokens.astype(jnp.int32)
    if not truncate and traced:
        raise ValueError(
            f"encoder_input_tokens has {shape[1]} columns, more than max_input_length="
            f"{max_input_length}; inside jax.jit pass truncate=True or shorter inputs."
        )
    xp = jnp if traced or isinstance(encoder_input_tokens, jax.Array) else np
    arr = encoder_input_tokens
    real = arr != pad_id
    lengths = xp.where(real.any(axis=1), shape[1] - xp.argmax(real[:, ::-1], axis=1), 0)
    ends_in_eos = xp.take_along_axis(arr, xp.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0] == eos_id
    cut = arr[:, :max_input_length].astype(xp.int32)
    fix = (lengths > max_input_length) & ends_in_eos
    last = xp.where(fix, eos_id, cut[:, max_input_length - 1])
    if xp is np:
        cut = cut.copy()
        cut[:, max_input_length - 1] = last
        return cut
    return cut.at[:, max_input_length - 1].set(last)


def raw_keys(rng, batch: int):
    """The call's randomness as raw uint32 keys: [2] (one key; the loop folds in the row index) or [b, 2].

    Args:
      rng: None (the fixed key ``PRNGKey(0)``: deterministic, fine for greedy decoding; pass your own key
        for independent samples), an int seed (any Python / NumPy int), a key (``jax.random.key`` or
        ``PRNGKey``), or one key per row ([b] typed keys or uint32[b, 2]); traced or not.
      batch: ``b``.
    Returns:
      uint32[2] or uint32[b, 2] (NumPy or JAX).
    Raises:
      ValueError: anything else, or per-row keys for a different batch size.
    """
    if rng is None:
        rng = 0
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_)):
        seed = int(rng)
        if 0 <= seed < 2**32:  # PRNGKey(seed) for the default threefry keys, without a device call
            return np.array([0, seed], np.uint32)
        rng = jax.random.PRNGKey(seed)
    if not hasattr(rng, "dtype"):
        raise ValueError(
            f"rng must be a PRNG key (jax.random.key / PRNGKey), an int seed, None, or one key per "
            f"row, got {type(rng).__name__}."
        )
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.key_data(rng)
    if rng.dtype != jnp.uint32 or rng.ndim not in (1, 2) or rng.shape[-1] != 2:
        raise ValueError(
            f"rng must be a PRNG key (jax.random.key / PRNGKey), an int seed, or one key per row, "
            f"got dtype {rng.dtype} shape {tuple(rng.shape)}."
        )
    if rng.ndim == 2 and rng.shape[0] != batch:
        raise ValueError(
            f"rng holds {rng.shape[0]} per-row keys for a batch of {batch}; pass one key (rows get "
            "fold_in(key, row)) or exactly one key per row."
        )
    return rng


def split_rows(keys: jax.Array, num: int) -> jax.Array:
    """keys uint32[b, 2] -> uint32[num, b, 2] (vmapped split, so each row only uses its own key)."""
    return jnp.swapaxes(jax.vmap(lambda k: jax.random.split(k, num))(keys), 0, 1)


def row_keys(raw: jax.Array, batch: int) -> jax.Array:
    """Inside the program: uint32[2] -> uint32[b, 2] by ``fold_in(key, row)``; [b, 2] is returned as is.

    Row ``i`` always gets ``fold_in(key, i)``, so a row's sample does not depend on the rest of the batch.
    """
    if raw.ndim == 2:
        return raw
    return jax.vmap(lambda i: jax.random.fold_in(raw, i))(jnp.arange(batch))


# ----------------------------------------------------------------------------------------------------------
# Batching for callers that decode many inputs (CLI generate, bench, peer comparisons)


def bucket_length(n: int, cap: int | None = None, minimum: int = 8) -> int:
    """The smallest power of two >= ``n`` (at least ``minimum``), capped at ``max(cap, n)``: padded input
    lengths that keep the number of compiled shapes small (one program per bucket)."""
    size = minimum
    while size < n:
        size *= 2
    return size if cap is None else min(size, max(cap, n))


def pad_batch(rows: Sequence[Sequence[int]], batch_size: int, length: int, pad_id: int = 0) -> np.ndarray:
    """Token id lists -> int32[batch_size, length], right-padded with ``pad_id``; missing rows are filled
    with copies of the first row (filler rows: same work as a real row, so they never add loop iterations;
    callers drop them).

    Raises:
      ValueError: no rows, more rows than ``batch_size``, or a row longer than ``length``.
    """
    if not rows:
        raise ValueError("No inputs to batch.")
    if len(rows) > batch_size:
        raise ValueError(f"{len(rows)} rows do not fit a batch of {batch_size}.")
    longest = max(len(r) for r in rows)
    if longest > length:
        raise ValueError(f"An input has {longest} tokens, more than the padded length {length}.")
    rows = list(rows) + [rows[0]] * (batch_size - len(rows))
    out = np.full((batch_size, length), pad_id, np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def batches(
    rows: Sequence[Sequence[int]], batch_size: int, length: int | None = None, pad_id: int = 0
) -> list[np.ndarray]:
    """Token id lists -> int32[batch_size, L] batches in order (the last one filled with copies of its first
    row); L = ``length`` or ``bucket_length`` of the longest row, so every batch of a run shares one shape.

    Raises:
      ValueError: see ``pad_batch``.
    """
    if not rows:
        raise ValueError("No inputs to batch.")
    L = length or bucket_length(max(len(r) for r in rows))
    return [pad_batch(rows[i : i + batch_size], batch_size, L, pad_id) for i in range(0, len(rows), batch_size)]

"""Logits to probabilities: temperature, top-k and top-p as per-row arrays, and drawing tokens.

Legend for shapes (STYLE.md): ``b`` batch, ``v`` vocab, ``...`` any further dimensions (e.g. ``k`` window).

Sources: Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
section 2.3 (warping is applied to both the draft's ``p`` and the target's ``q``, so speculative sampling
samples exactly from the warped target); Holtzman et al. 2020 (nucleus / top-p sampling); t5x
``decoding.temperature_sample`` (temperature and top-k as arrays); vLLM / tpu-inference (per-request sampling
parameters in one batch).

Sampling parameters are **traced arrays, one value per row** (``SamplingParams``), so one compiled program
serves every temperature, top-k and top-p, and a batch may mix greedy rows (temperature 0) with sampled ones.
Temperature 0 is the one-hot (argmax) limit of the same warping: ``probs`` returns a one-hot row there, and
the speculative acceptance rule on one-hot p and q *is* greedy verification (``specjax.decoding.verify``), so
greedy and sampled rows share one rule. Where every row of a call is greedy, the loops take a faster branch
(argmax straight from the logits) chosen at run time by ``lax.cond``, not by recompiling.

Everything works on **float32 probabilities**, computed from the very logits each token was drawn from.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "SamplingParams",
    "Sampler",
    "warp",
    "sample_from",
    "sample_rows",
    "acceptance_probability",
    "residual",
    "validate_sampling",
    "overlap",
    "argmax",
]


def _is_tracer(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def validate_sampling(temperature, top_k, top_p) -> None:
    """Checks sampling settings (scalars or per-row arrays) where their values are known.

    Python, NumPy and JAX numbers of any int / float type are accepted; traced values (inside ``jax.jit``)
    are not checked (t5x's ``_is_tracer`` pattern).

    Raises:
      ValueError: ``temperature`` negative or not finite; ``top_k`` negative or not integral;
        ``top_p`` outside (0, 1]. The message names the setting and what to pass instead.
    """

    def values(name, x):
        if _is_tracer(x):
            return None
        if isinstance(x, (bool, np.bool_)) or (hasattr(x, "dtype") and np.asarray(x).dtype == bool):
            raise ValueError(f"{name} must be a number or an array of numbers, got a bool {x!r}.")
        try:
            arr = np.asarray(x)
        except Exception:  # pragma: no cover - exotic objects
            raise ValueError(f"{name} must be a number or an array of numbers, got {x!r}.") from None
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number)):
            raise ValueError(f"{name} must be a number or an array of numbers, got {x!r}.")
        return arr

    t = values("temperature", temperature)
    if t is not None and (not np.all(np.isfinite(t)) or np.any(t < 0)):
        raise ValueError(
            f"temperature must be a finite number >= 0, got {temperature!r}; use 0 for greedy "
            "(argmax) decoding and 1 to sample from the model's own distribution."
        )
    k = values("top_k", top_k)
    if k is not None and (np.any(k < 0) or not np.all(np.mod(k, 1) == 0)):
        raise ValueError(f"top_k must be an int >= 0, got {top_k!r}; use 0 to keep every token.")
    p = values("top_p", top_p)
    if p is not None and (not np.all(np.isfinite(p)) or np.any(p <= 0) or np.any(p > 1)):
        raise ValueError(
            f"top_p must be in (0, 1], got {top_p!r}; use 1.0 to keep every token "
            "(nucleus sampling keeps the smallest set of tokens whose mass reaches top_p)."
        )


class SamplingParams(NamedTuple):
    """Per-row sampling parameters: a pytree of arrays, traced under ``jax.jit`` (never static).

    Attributes:
      temperature: float32[b], >= 0; 0 is greedy (argmax, first index on ties). Concrete values are checked;
        a traced negative value (unchecked inside jax.jit) is read as 0, greedy.
      top_k: int32[b], keep the ``top_k`` largest logits (ties with the k-th are kept); 0 keeps all.
      top_p: float32[b] in (0, 1]; nucleus sampling (Holtzman et al. 2020) keeps the smallest set of most
        probable tokens whose mass reaches ``top_p`` (ties kept); 1 keeps all.
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array

    @classmethod
    def broadcast(cls, batch: int, temperature=1.0, top_k=0, top_p=1.0) -> "SamplingParams":
        """Scalars or [b] arrays (any int / float type, traced or not) -> ``SamplingParams`` of [b] arrays.

        Raises:
          ValueError: a value outside its range (when concrete, ``validate_sampling``) or an array whose
            shape is neither a scalar nor [b].
        """
        validate_sampling(temperature, top_k, top_p)
        out = []
        for name, x, dtype in (
            ("temperature", temperature, jnp.float32),
            ("top_k", top_k, jnp.int32),
            ("top_p", top_p, jnp.float32),
        ):
            shape = np.shape(x)
            if shape not in ((), (batch,)):
                raise ValueError(f"{name} must be a scalar or one value per row (shape ({batch},)), got shape {shape}.")
            if _is_tracer(x):
                out.append(jnp.broadcast_to(jnp.asarray(x).astype(dtype), (batch,)))
            else:  # concrete values (NumPy, Python, or JAX arrays): one host array, the same program signature
                # whatever type the caller used (a device array would be a separate jit cache entry)
                out.append(np.broadcast_to(np.asarray(x).astype(dtype), (batch,)))
        return cls(*out)

    def probs(self, logits: jax.Array) -> jax.Array:
        """Warped float32 probabilities of logits [b, ..., v] (any float dtype); see ``warp``."""
        return warp(logits, self.temperature, self.top_k, self.top_p)

    def all_greedy(self) -> jax.Array:
        """bool[]: every row is at temperature 0 (the loops then take the argmax branch)."""
        return jnp.all(self.temperature <= 0)


def argmax(x: jax.Array) -> jax.Array:
    """Index of the largest entry along the last axis, the first one on ties: int32 [...] from x [..., v].

    The same result as ``jnp.argmax(x, axis=-1)`` (NaN counts as the largest, its first occurrence wins), computed
    as a max, a compare and a min over an iota: plain reductions that XLA:CPU vectorises, where ``jnp.argmax``
    is a variadic (value, index) reduction that it runs element by element. Measured on a 2-core AMD EPYC (8k
    vocabulary, inside a compiled loop): 37 -> 11 us per row
    (``benchmarks/results/loop_overhead/2026-12-03_loop_overhead.md``); the decode loops take one per draft step
    and one per verified window at temperature 0.
    """
    x = jnp.asarray(x)
    top = jnp.max(x, axis=-1, keepdims=True)
    # max is NaN where a NaN is present; then the first NaN is the argmax. Some entry always hits.
    return _first_true((x == top) | jnp.isnan(x))


def _first_true(mask: jax.Array) -> jax.Array:
    """Index of the first True along the last axis, int32 [...] from bool [..., v]; ``v`` where none is True.
    A min over an iota: a plain reduction (XLA:CPU runs ``jnp.argmax``'s variadic one element by element)."""
    iota = jax.lax.broadcasted_iota(jnp.int32, mask.shape, mask.ndim - 1)
    return jnp.min(jnp.where(mask, iota, mask.shape[-1]), axis=-1).astype(jnp.int32)


def _per_row(x, ndim):
    """[b] -> [b, 1, ..., 1] with ``ndim`` dimensions in all."""
    return jnp.reshape(x, x.shape + (1,) * (ndim - 1))


def warp(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Warped probabilities: temperature, then top-k, then top-p, each row with its own values.

    Args:
      logits: float[b, ..., v] (any float dtype; computed in float32).
      temperature: float32[b] (0: one-hot at the argmax, whatever top-k / top-p say).
      top_k: int32[b] (0 or >= v: no top-k). top_p: float32[b] in (0, 1] (1: no top-p).
    Returns:
      float32[b, ..., v], each distribution summing to 1. The top-k / top-p thresholds are found by one sort
      of the scaled logits and applied as a logit threshold (so ties are kept and no rounding of sorted
      probabilities can drop a kept token); the sort runs only when some row asks for it (``lax.cond``).
    """
    logits = jnp.asarray(logits).astype(jnp.float32)
    nd, v = logits.ndim, logits.shape[-1]
    greedy = temperature <= 0  # a negative (traced, unchecked) temperature decodes greedily, never garbage
    scaled = logits / _per_row(jnp.where(greedy, 1.0, temperature), nd)
    k_eff = jnp.where((top_k > 0) & (top_k < v), top_k, v)  # [b]
    filtered_rows = ~greedy & ((k_eff < v) | (top_p < 1.0))

    def filtered(scaled):
        sorted_desc = -jnp.sort(-scaled, axis=-1)  # [b, ..., v]
        kth = jnp.take_along_axis(
            sorted_desc, jnp.broadcast_to(_per_row(k_eff - 1, nd), sorted_desc.shape[:-1] + (1,)), axis=-1
        )
        sorted_k = jnp.where(sorted_desc >= kth, sorted_desc, -jnp.inf)
        sorted_probs = jax.nn.softmax(sorted_k, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        keep = mass_before < _per_row(top_p, nd)  # the largest is always kept (mass 0 < top_p)
        nucleus = jnp.min(jnp.where(keep, sorted_k, jnp.inf), axis=-1, keepdims=True)
        threshold = jnp.where(_per_row(top_p, nd) >= 1.0, kth, jnp.maximum(nucleus, kth))
        return jnp.where(scaled >= threshold, scaled, -jnp.inf)

    scaled = jax.lax.cond(jnp.any(filtered_rows), filtered, lambda s: s, scaled)
    probs = jax.nn.softmax(scaled, axis=-1)
    one_hot = jax.nn.one_hot(argmax(logits), v, dtype=jnp.float32)
    return jnp.where(_per_row(greedy, nd), one_hot, probs)


def sample_from(key: jax.Array, probs: jax.Array, greedy: bool = False) -> jax.Array:
    """Draws int32 [...] from float32 probabilities [..., v] with one key; ``greedy`` takes the argmax.

    Inverse-CDF sampling: one uniform ``u`` per distribution, scaled by the total mass, and the first token
    whose cumulative probability exceeds it. Its distribution is exactly ``probs / sum(probs)`` up to float32
    rounding of the cumulative sum; zero-probability tokens are never drawn (their interval is empty), so a
    one-hot row always yields its token. One random number per row instead of ``v`` Gumbel draws
    (``jax.random.categorical``): measured 4.8x faster per draft step at batch 1 and 13x at batch 32 on
    this project's CPU (8k vocabulary), the same order as the softmax itself.
    """
    if greedy:
        return argmax(probs)
    cdf = jnp.cumsum(probs, axis=-1)  # [..., v]
    u = jax.random.uniform(key, probs.shape[:-1], jnp.float32) * cdf[..., -1]  # [...], in [0, total)
    first = _first_true(cdf > u[..., None])  # the first index with cdf > u
    return jnp.where(first == probs.shape[-1], 0, first)  # none: 0, as jnp.argmax of an all-False row


def sample_rows(keys: jax.Array, probs: jax.Array) -> jax.Array:
    """One token per row, each row with its own key: keys uint32[b, 2], probs float32[b, v] -> int32[b]."""
    return jax.vmap(sample_from)(keys, probs)


def acceptance_probability(p_x: jax.Array, q_x: jax.Array) -> jax.Array:
    """``min(1, q(x) / p(x))``: the chance a drafted token ``x`` is kept (Leviathan et al. 2023, Alg. 1).

    Args:
      p_x: float32 [...], the draft's probability of the drafted token (> 0, since it was drawn from p).
      q_x: float32 [...], the target's probability of the same token.
    Returns float32 [...]; where ``p_x == 0`` (never for a token drawn from p) it is 1.
    """
    return jnp.where(p_x > 0, jnp.minimum(1.0, q_x / jnp.where(p_x > 0, p_x, 1.0)), 1.0)


def residual(p: jax.Array, q: jax.Array) -> jax.Array:
    """``norm(max(0, q - p))``: where to sample after a rejection (Leviathan et al. 2023, section 2.3).

    Args:
      p, q: float32 [..., v] draft and target probabilities at the same position.
    Returns:
      float32 [..., v] summing to 1. Where ``q <= p`` everywhere (then a rejection has probability 0) it
      returns ``q``, so the result is always a distribution.
    """
    diff = jnp.maximum(q - p, 0.0)
    total = jnp.sum(diff, axis=-1, keepdims=True)
    return jnp.where(total > 0, diff / jnp.where(total > 0, total, 1.0), q)


def overlap(p: jax.Array, q: jax.Array) -> jax.Array:
    """The paper's β = Σ_x min(p(x), q(x)) (Leviathan et al. 2023, definition 3.1): the chance a token drawn
    from ``p`` is accepted against ``q``.

    Computed as ``1 − ½ Σ_x |p(x) − q(x)|`` (equal for distributions, since ``min(a, b) = (a + b − |a − b|)/2``),
    so that ``p == q`` gives exactly 1.0 in float32 whatever the rounding of ``Σ p``; clipped to [0, 1].

    Args:
      p, q: float32 [..., v] distributions (each summing to 1).
    Returns:
      float32 [...].
    """
    return jnp.clip(1.0 - 0.5 * jnp.sum(jnp.abs(p - q), axis=-1), 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Sampler:
    """Scalar warping settings with the same ``probs`` as the loops use (for tests, notebooks, references).

    The loops take per-row arrays (``SamplingParams``); a ``Sampler`` is the same warping for one setting.

    Attributes:
      temperature: >= 0 (0: greedy). top_k: >= 0 (0: all). top_p: in (0, 1] (1: all).
    Raises:
      ValueError: see ``validate_sampling``.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if isinstance(self.top_k, float) and not math.isfinite(self.top_k):
            raise ValueError(f"top_k must be an int >= 0, got {self.top_k!r}.")
        validate_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        """True at temperature 0 (argmax decoding)."""
        return self.temperature == 0

    def probs(self, logits) -> jax.Array:
        """float[..., v] -> float32[..., v] warped probabilities (``warp`` with this setting on every row)."""
        logits = jnp.asarray(logits)
        flat = logits.reshape((-1, logits.shape[-1]))
        b = flat.shape[0]
        params = SamplingParams.broadcast(b, self.temperature, self.top_k, self.top_p)
        return warp(flat, *params).reshape(logits.shape)

    def sample(self, key, probs) -> jax.Array:
        """One token per row from float32 ``probs`` [..., v] -> int32 [...]; greedy: the argmax, no key used."""
        return sample_from(key, probs, greedy=self.greedy)

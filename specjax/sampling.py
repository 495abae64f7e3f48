"""Logits to probabilities, and the speculative acceptance rule.

Legend for shapes (STYLE.md): ``b`` batch, ``v`` vocab, ``g`` gamma (draft tokens per iteration).
``...`` is any leading batch shape.

Sources: Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
Algorithm 1 and section 2.3 (the rule and its proof of exactness); Chen et al. 2023, "Accelerating Large
Language Model Decoding with Speculative Sampling", Algorithm 2 (the same rule, written with ``max(0, q-p)``).

Everything here works on **float32 probabilities**. The warping (temperature, top-k, top-p) is applied to
both the draft's ``p`` and the target's ``q`` with the same ``Sampler``, so speculative sampling samples
exactly from the target under that warping. Temperature 0 is the one-hot (argmax) limit.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

__all__ = ["Sampler", "acceptance_probability", "residual", "accept_or_resample", "validate_sampling"]


def validate_sampling(temperature, top_k, top_p) -> None:
    """Checks sampling settings in Python (before anything compiles).

    Raises:
      ValueError: ``temperature`` negative or not finite; ``top_k`` negative or not an int;
        ``top_p`` outside (0, 1]. The message names the setting and what to pass instead.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}; use 0 for greedy "
                         "(argmax) decoding and 1 to sample from the model's own distribution.")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0, got {top_k!r}; use 0 to keep every token.")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}; use 1.0 to keep every token "
                         "(nucleus sampling keeps the smallest set of tokens whose mass reaches top_p).")


@dataclasses.dataclass(frozen=True)
class Sampler:
    """How logits become the distribution tokens are drawn from: temperature, then top-k, then top-p.

    A frozen, hashable dataclass, so it can be a static argument of ``jax.jit``.

    Attributes:
      temperature: logits are divided by it; 0 means greedy (one-hot at the argmax, first index on ties).
      top_k: keep the ``top_k`` largest logits (ties with the k-th largest are kept too); 0 keeps all.
      top_p: nucleus sampling (Holtzman et al. 2020): keep the smallest set of most probable tokens whose
        mass reaches ``top_p`` (ties with the last kept probability are kept too); 1.0 keeps all.
    Raises:
      ValueError: see ``validate_sampling``.
    """
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        validate_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        """True at temperature 0 (argmax decoding)."""
        return self.temperature == 0

    def probs(self, logits: jax.Array) -> jax.Array:
        """Warped probabilities: logits [..., v] (any float dtype) -> float32 [..., v], rows summing to 1.

        At temperature 0 the result is one-hot at ``argmax(logits)`` (top-k and top-p do not matter).
        """
        logits = jnp.asarray(logits).astype(jnp.float32)
        vocab = logits.shape[-1]
        if self.greedy:
            return jax.nn.one_hot(jnp.argmax(logits, axis=-1), vocab, dtype=jnp.float32)
        logits = logits / jnp.float32(self.temperature)
        if 0 < self.top_k < vocab:
            kth = jax.lax.top_k(logits, self.top_k)[0][..., -1:]  # [..., 1]
            logits = jnp.where(logits >= kth, logits, -jnp.inf)
        probs = jax.nn.softmax(logits, axis=-1)
        if self.top_p < 1.0:
            sorted_desc = -jnp.sort(-probs, axis=-1)  # [..., v]
            mass_before = jnp.cumsum(sorted_desc, axis=-1) - sorted_desc
            keep_sorted = mass_before < jnp.float32(self.top_p)  # the first (largest) is always kept
            # The smallest kept probability; every token at least this probable is kept.
            threshold = jnp.min(jnp.where(keep_sorted, sorted_desc, jnp.inf), axis=-1, keepdims=True)
            probs = jnp.where(probs >= threshold, probs, 0.0)
            probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
        return probs

    def sample(self, key: jax.Array, probs: jax.Array) -> jax.Array:
        """One token per row from float32 ``probs`` [..., v] -> int32 [...]. Greedy: the argmax, no key used.

        Zero-probability tokens are never drawn (log 0 = -inf).
        """
        return sample_from(key, probs, greedy=self.greedy)


def sample_from(key: jax.Array, probs: jax.Array, greedy: bool = False) -> jax.Array:
    """Draws int32 [...] from float32 probabilities [..., v]; ``greedy`` takes the argmax instead."""
    if greedy:
        return jnp.argmax(probs, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)


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


def accept_or_resample(key: jax.Array, draft_tokens: jax.Array, p: jax.Array, q: jax.Array,
                       greedy: bool = False) -> tuple[jax.Array, jax.Array]:
    """The verification step of one row: how many drafted tokens are kept, and the token after them.

    Draft token ``x_i`` is accepted while ``r_i < min(1, q_i(x_i) / p_i(x_i))`` with ``r_i ~ U[0, 1)``
    (tested as ``r_i * p_i(x_i) < q_i(x_i)``); at the first rejection ``i`` the next token is drawn from
    ``residual(p_i, q_i)``; if all ``g`` are accepted, from ``q_{g+1}`` (the bonus token). Leviathan et al.
    2023, Algorithm 1; the emitted token has distribution ``q`` (their Theorem / section 2.3).

    At temperature 0 (``greedy``; p and q one-hot) this is: accept while ``argmax q_i == x_i``, then emit
    ``argmax q`` at the first mismatch (or the bonus argmax), which is exactly target-greedy decoding.

    Args:
      key: one PRNG key for this row (unused when ``greedy``).
      draft_tokens: int32 [g], the drafted tokens ``x_1..x_g``.
      p: float32 [g, v], the draft distributions each ``x_i`` was drawn from.
      q: float32 [g + 1, v], the target distributions at the same positions plus the bonus position.
      greedy: temperature 0.
    Returns:
      (num_accepted int32 [] in [0, g], next_token int32 []). The row emits
      ``x_1..x_{num_accepted}`` then ``next_token``.
    """
    g = draft_tokens.shape[0]
    key_accept, key_next = jax.random.split(key)
    p_x = jnp.take_along_axis(p, draft_tokens[:, None], axis=-1)[:, 0]  # [g]
    q_x = jnp.take_along_axis(q[:g], draft_tokens[:, None], axis=-1)[:, 0]  # [g]
    if greedy:
        accepted = jnp.argmax(q[:g], axis=-1) == draft_tokens  # [g]
    else:
        r = jax.random.uniform(key_accept, (g,), jnp.float32)
        accepted = r * p_x < q_x  # r < q/p without dividing; p_x > 0 for drawn tokens
    num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32)))
    # Rejected at position num_accepted (< g): residual of that position; all accepted: q_{g+1}.
    p_pad = jnp.concatenate([p, jnp.zeros_like(p[:1])], axis=0)  # [g + 1, v]; p = 0 at the bonus slot
    p_a = p_pad[num_accepted]
    q_a = q[num_accepted]
    next_dist = jnp.where(num_accepted < g, residual(p_a, q_a), q_a)
    next_token = sample_from(key_next, next_dist, greedy=greedy)
    return num_accepted.astype(jnp.int32), next_token

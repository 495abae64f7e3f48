"""Verifiers: given γ drafted tokens and the target's logits at the γ + 1 window positions, how many drafts are
kept and which token follows them. One interface, one place for greedy and sampled rows.

Legend for shapes (STYLE.md): ``b`` batch, ``g`` gamma, ``k`` window (g + 1), ``v`` vocab.

Greedy (temperature 0) is not a separate rule: ``SamplingParams.probs`` gives one-hot p and q there, and the
rules below on one-hot distributions accept while the target's argmax equals the draft and then emit the
target's argmax, which is target-greedy decoding. When *every* row of a call is greedy, ``lax.cond`` takes a
branch that computes the same thing from argmaxes without building [b, k, v] probabilities (a run-time
branch, not a recompile).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp

from specjax.sampling import SamplingParams, argmax, overlap, residual, sample_rows

__all__ = ["Proposal", "Verdict", "Verifier", "TokenVerifier", "token_verify", "accept_or_resample"]


class Proposal(NamedTuple):
    """What a draft source proposes for one iteration.

    Attributes:
      tokens: int32[b, g] drafted tokens ``x_1..x_g``.
      probs: float32[b, g, v], the distributions ``p_i`` each ``x_i`` was drawn from (warped like q), or
        None for a point mass (p one-hot at ``x_i``: prompt lookup). Unused (may be zeros) when every row
        is greedy.
      lengths: int32[b] drafted slots per row (<= g); slots past it hold no draft and are never accepted.
    """

    tokens: jax.Array
    probs: jax.Array | None
    lengths: jax.Array


class Verdict(NamedTuple):
    """A verifier's answer per row: ``num_accepted`` int32[b] in [0, g], ``next_token`` int32[b] (emitted after
    the accepted drafts), ``beta`` float32[b, g] (the paper's β = Σ_x min(p_i(x), q_i(x)) at each draft
    position; the commit step keeps the verified positions)."""

    num_accepted: jax.Array
    next_token: jax.Array
    beta: jax.Array


class Verifier(Protocol):
    """A verification rule (frozen dataclass, static under jit) with one method."""

    def verify(
        self, keys: jax.Array, proposal: Proposal, target_logits: jax.Array, sampling: SamplingParams
    ) -> Verdict:
        """keys uint32[b, 2], target_logits float[b, k, v] -> ``Verdict``."""


def _one_hot_probs(proposal: Proposal, v: int) -> jax.Array:
    return jax.nn.one_hot(proposal.tokens, v, dtype=jnp.float32)


def token_verify(keys, drafted, p, q, lengths=None):
    """Token verification (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2), all rows.

    Step 1: ``r_i ~ U[0, 1)``; ``x_i`` is accepted while ``r_i · p_i(x_i) < q_i(x_i)`` (i.e.
    ``r_i < min(1, q_i(x_i) / p_i(x_i))``; ``p_i(x_i) > 0`` for a drawn token).
    Step 2: ``a`` = the number accepted before the first rejection.
    Step 3: the next token is drawn from ``norm(max(0, q_a − p_a))`` after a rejection, or from ``q_{g+1}``
    when all ``g`` are accepted (the bonus token). The emitted token then has distribution ``q`` exactly
    (Leviathan et al. 2023, Appendix A.1).

    Args:
      keys: uint32[b, 2] one key per row. drafted: int32[b, g]. p: float32[b, g, v]. q: float32[b, k, v].
      lengths: int32[b] drafted slots (default g); slots past it are rejected and their p taken as 0, so the
        next token is drawn from ``q`` there.
    Returns:
      (num_accepted int32[b], next_token int32[b], beta float32[b, g]).
    """
    b, g = drafted.shape
    rows = jnp.arange(b)
    if lengths is not None:
        drafted_slot = jnp.arange(g)[None, :] < lengths[:, None]  # [b, g]
        p = jnp.where(drafted_slot[..., None], p, 0.0)
    split = jax.vmap(lambda k: jax.random.split(k, 2))(keys)  # [b, 2, 2]
    accept_keys, next_keys = split[:, 0], split[:, 1]
    p_x = jnp.take_along_axis(p, drafted[..., None], axis=-1)[..., 0]  # [b, g]
    q_x = jnp.take_along_axis(q[:, :g], drafted[..., None], axis=-1)[..., 0]  # [b, g]
    r = jax.vmap(lambda k: jax.random.uniform(k, (g,), jnp.float32))(accept_keys)  # [b, g]
    accepted = (r * p_x < q_x) & (p_x > 0)
    num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)  # [b]
    p_pad = jnp.concatenate([p, jnp.zeros_like(p[:, :1])], axis=1)  # [b, k, v]; p = 0 at the bonus slot
    next_dist = residual(p_pad[rows, num_accepted], q[rows, num_accepted])  # residual(0, q) = q
    next_token = sample_rows(next_keys, next_dist)
    beta = overlap(p, q[:, :g])  # [b, g]
    return num_accepted.astype(jnp.int32), next_token, beta


def _greedy_verdict(proposal: Proposal, target_logits: jax.Array) -> Verdict:
    """Every row at temperature 0: accept while the target's argmax equals the draft, emit the argmax."""
    g = proposal.tokens.shape[1]
    target_tokens = argmax(target_logits)  # [b, k]
    agree = (target_tokens[:, :g] == proposal.tokens) & (jnp.arange(g)[None, :] < proposal.lengths[:, None])
    num_accepted = jnp.sum(jnp.cumprod(agree.astype(jnp.int32), axis=1), axis=1)
    next_token = jnp.take_along_axis(target_tokens, num_accepted[:, None], axis=1)[:, 0]
    return Verdict(num_accepted.astype(jnp.int32), next_token, agree.astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class TokenVerifier:
    """Token verification (Leviathan et al. 2023, Algorithm 1): ``verification="token"``."""

    def verify(self, keys, proposal: Proposal, target_logits, sampling: SamplingParams) -> Verdict:
        """See ``Verifier.verify`` and ``token_verify``."""

        def sampled(_):
            q = sampling.probs(target_logits)  # [b, k, v]
            p = _one_hot_probs(proposal, q.shape[-1]) if proposal.probs is None else proposal.probs
            return Verdict(*token_verify(keys, proposal.tokens, p, q, proposal.lengths))

        return jax.lax.cond(sampling.all_greedy(), lambda _: _greedy_verdict(proposal, target_logits), sampled, None)


def accept_or_resample(
    key: jax.Array, draft_tokens: jax.Array, p: jax.Array, q: jax.Array, greedy: bool = False
) -> tuple[jax.Array, jax.Array]:
    """Token verification of one row (Leviathan et al. 2023, Algorithm 1): accepted count and next token.

    A one-row view of ``TokenVerifier`` (the rule the loop runs): ``x_i`` is
    accepted while ``r_i < min(1, q_i(x_i) / p_i(x_i))``; at the first rejection the next token is drawn from
    ``residual(p_i, q_i)``, and after ``g`` acceptances from ``q_{g+1}`` (the bonus token). With one-hot
    ``p`` and ``q`` (temperature 0, ``greedy``) this is: accept while ``argmax q_i == x_i``, then emit the
    target's argmax.

    Args:
      key: one PRNG key for this row (unused when ``greedy``).
      draft_tokens: int32 [g]; p: float32 [g, v] (the distributions they were drawn from);
      q: float32 [g + 1, v]; greedy: temperature 0 (p and q are then read as one-hots at their argmax).
    Returns:
      (num_accepted int32 [] in [0, g], next_token int32 []).
    """
    if greedy:
        v = q.shape[-1]
        q = jax.nn.one_hot(argmax(q), v, dtype=jnp.float32)
        p = jax.nn.one_hot(draft_tokens, v, dtype=jnp.float32)
    num_accepted, next_token, _ = token_verify(key[None], draft_tokens[None], p[None], q[None])
    return num_accepted[0], next_token[0]

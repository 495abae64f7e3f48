"""Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami & Suresh, "Block Verification
Accelerates Speculative Decoding", ICLR 2025, arXiv 2403.10444, Algorithm 2): the γ drafts are verified as a
block instead of token by token. Same interface as ``TokenVerifier``; ``verification="block"``.

Legend for shapes (STYLE.md): ``b`` batch, ``g`` gamma, ``k`` window (g + 1), ``v`` vocab.

The rule, per row, in our letters (draft distributions ``p_i``, target ``q_i``, drafts ``x_1..x_g``, ``L`` =
``proposal.lengths`` drafted slots; slots ``>= L`` and the bonus slot ``g + 1`` have ``p = 0``):

  Step 1  weights: ``w_0 = 1``, ``w_i = min(1, w_{i-1} · q_i(x_i) / p_i(x_i))`` (the paper's ``p_i``), and
          ``w_i = 0`` for undrafted slots ``i > L``.
  Step 2  weighted residual mass after the prefix ``x_1..x_i``:
          ``R_i = Σ_x max(w_i · q_{i+1}(x) − p_{i+1}(x), 0)``, for ``i = 0..g``.
  Step 3  ``h_i = R_i / (R_i + 1 − w_i)`` for ``i = 1..g`` (the paper's ``h_i``; at the last drafted slot
          ``p_{L+1} = 0`` so ``R_L = w_L`` and ``h_L = w_L``, the paper's ``h_γ = p_γ``; ``h_i = 0`` past ``L``).
  Step 4  ``η_i ~ U[0, 1)``; ``τ`` = the *largest* ``i`` with ``η_i < h_i`` (0 if none). ``x_1..x_τ`` are
          accepted (a later success overrides an earlier failure: that is where it beats token verification).
  Step 5  the next token is drawn from ``norm(max(w_τ · q_{τ+1} − p_{τ+1}, 0))`` (the paper's ``p_res``):
          after ``τ = L`` this is ``q_{L+1}`` itself (the bonus token when ``L = g``).

The output has exactly the target's distribution (the paper's Theorem 1; ``tests/test_verifiers_and_drafts.py``
checks it by exact enumeration and chi-square) and the expected number of accepted drafts is never below
token verification's (Theorem 2). At temperature 0 (one-hot p and q) ``w_i = 1`` exactly while the draft
equals the target's argmax and 0 after, ``h_i = 1`` at the last agreeing slot before a disagreement, so ``τ``
is the agreeing prefix and the next token the target's argmax: token verification's greedy rule, which is
what the all-greedy branch runs. ``beta`` is the paper's β = Σ min(p, q) per position, as for token
verification (Leviathan et al. 2023 §3.1 — a property of p and q, not of the verifier).

A proposal whose length is a stopping time of its own drafts (confidence-stopped drafting) is a block drawn
from a draft that emits "stop" after its prefix; the rule above treats its slots past ``L`` as p = 0, which
is that draft's distribution over real tokens, and stays exact (checked by enumeration in the tests).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.decoding.verify import Proposal, Verdict, _greedy_verdict, _one_hot_probs
from specjax.sampling import SamplingParams, overlap, sample_rows

__all__ = ["BlockVerifier", "block_verify", "block_acceptance"]


def block_acceptance(drafted, p, q, lengths=None):
    """Steps 1-3 of block verification and the residuals of step 5, for every row and every ``τ``.

    Args:
      drafted: int32[b, g]. p: float32[b, g, v] (the distributions the drafts were drawn from, warped like
        q). q: float32[b, k, v] (the target's). lengths: int32[b] drafted slots (default g).
    Returns:
      (h float32[b, g]: ``h_1..h_g``; residuals float32[b, k, v]: row ``τ`` is the distribution the next
      token is drawn from when ``τ`` drafts are accepted, summing to 1).
    """
    b, g = drafted.shape
    if lengths is not None:
        drafted_slot = jnp.arange(g)[None, :] < lengths[:, None]  # [b, g]
        p = jnp.where(drafted_slot[..., None], p, 0.0)
    p_x = jnp.take_along_axis(p, drafted[..., None], axis=-1)[..., 0]  # [b, g]
    q_x = jnp.take_along_axis(q[:, :g], drafted[..., None], axis=-1)[..., 0]  # [b, g]
    ratio = jnp.where(p_x > 0, q_x / jnp.where(p_x > 0, p_x, 1.0), 0.0)  # 0 past the drafted slots

    # Step 1: w_i = min(1, w_{i-1} ratio_i), w_0 = 1 (g is small and static: unrolled).
    weights = [jnp.ones((b,), jnp.float32)]
    for i in range(g):
        weights.append(jnp.minimum(1.0, weights[-1] * ratio[:, i]))
    w = jnp.stack(weights, axis=1)  # [b, k]

    # Step 2: R_i = Σ_x max(w_i q_{i+1} − p_{i+1}, 0), p = 0 at the bonus slot.
    p_pad = jnp.concatenate([p, jnp.zeros_like(p[:, :1])], axis=1)  # [b, k, v]
    excess = jnp.maximum(w[..., None] * q - p_pad, 0.0)  # [b, k, v]
    mass = jnp.sum(excess, axis=-1)  # [b, k]

    # Step 3: h_i = R_i / (R_i + 1 − w_i). The denominator is 0 only when w_i = 1 and R_i = 0; then
    # w_{i+1} = 1 and h_{i+1} = 1 (or the same case again), so τ > i surely and h_i is never read.
    denom = mass + 1.0 - w
    h = jnp.where(denom > 0, mass / jnp.where(denom > 0, denom, 1.0), 0.0)[:, 1:]  # [b, g]

    # Step 5's distributions (norm of the excess; q where the excess is empty, which has probability 0).
    residuals = jnp.where(mass[..., None] > 0, excess / jnp.where(mass > 0, mass, 1.0)[..., None], q)
    return h, residuals


def block_verify(keys, drafted, p, q, lengths=None):
    """Block verification (Sun et al. 2025, Algorithm 2), all rows; see the module docstring for the steps.

    Args:
      keys: uint32[b, 2] one key per row. drafted: int32[b, g]. p: float32[b, g, v]. q: float32[b, k, v].
      lengths: int32[b] drafted slots (default g); slots past it are never accepted.
    Returns:
      (num_accepted int32[b] = τ, next_token int32[b], beta float32[b, g]).
    """
    b, g = drafted.shape
    split = jax.vmap(lambda k: jax.random.split(k, 2))(keys)  # [b, 2, 2]
    eta_keys, next_keys = split[:, 0], split[:, 1]
    h, residuals = block_acceptance(drafted, p, q, lengths)
    # Step 4: τ = the largest i with η_i < h_i.
    eta = jax.vmap(lambda k: jax.random.uniform(k, (g,), jnp.float32))(eta_keys)  # [b, g]
    passed = eta < h
    slot = jnp.arange(1, g + 1)[None, :]
    tau = jnp.max(jnp.where(passed, slot, 0), axis=1)  # [b]
    # Step 5: the next token from the residual after τ.
    next_token = sample_rows(next_keys, residuals[jnp.arange(b), tau])
    if lengths is not None:
        p = jnp.where((jnp.arange(g)[None, :] < lengths[:, None])[..., None], p, 0.0)
    beta = overlap(p, q[:, :g])  # [b, g]
    return tau.astype(jnp.int32), next_token, beta


@dataclasses.dataclass(frozen=True)
class BlockVerifier:
    """Block verification (Sun et al. 2025, Algorithm 2): ``verification="block"``.

    Never accepts fewer drafts in expectation than ``TokenVerifier`` and costs no extra model call; the
    output distribution is the target's. When every row is greedy it runs token verification's argmax rule,
    which is what block verification reduces to on one-hot p and q (module docstring).
    """

    def verify(self, keys, proposal: Proposal, target_logits, sampling: SamplingParams) -> Verdict:
        """keys uint32[b, 2], target_logits float[b, k, v] -> ``Verdict`` (see ``Verifier.verify``)."""

        def sampled(_):
            q = sampling.probs(target_logits)  # [b, k, v]
            p = _one_hot_probs(proposal, q.shape[-1]) if proposal.probs is None else proposal.probs
            return Verdict(*block_verify(keys, proposal.tokens, p, q, proposal.lengths))

        return jax.lax.cond(sampling.all_greedy(), lambda _: _greedy_verdict(proposal, target_logits), sampled, None)

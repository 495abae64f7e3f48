"""Multi-draft speculative sampling: ``k`` draft continuations per row, verified in one target call, exactly.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``g`` gamma, ``w`` branch window (g + 1),
``k`` branches (``num_drafts``; in this module only — elsewhere ``k`` is the window), ``v`` vocab.

One iteration, per row (``speculative_sample(..., num_drafts=k)``):

  Step 1  draft, branch point: the draft's distribution ``p`` at the row's next position (its first step, as in
          single-draft decoding) gives ``k`` distinct candidates ``x^1..x^k``, drawn *without replacement*
          (Gumbel-top-k: Kool, van Hoof & Welling 2019, "Stochastic Beams and Where to Find Them", the
          Gumbel-top-k trick, equal in law to drawing one after another, each from ``p`` with the earlier ones
          removed and renormalised). Candidate ``j`` was drawn from ``p^(j)``: ``p`` without ``x^1..x^{j-1}``,
          renormalised. Greedy rows take the draft's top-k tokens, each "drawn" from a point mass.
          (When ``p`` has fewer than ``k`` tokens, top-k / top-p, the extra candidates are invalid: never tried.)
  Step 2  draft, branches: each candidate continues with ``g − 1`` draft steps of its own. The draft's cache
          after step 1 is copied ``k`` times (``fork_rows``: the branches are extra batch rows of the draft; it
          costs one copy of the draft's cache per iteration and the draft's steps run on ``b · k`` rows).
  Step 3  verify: the target scores the ``k`` windows ``[d[n], x^j_1..x^j_g]`` in one call
          (``decode_branches``): ``k · w`` query rows and one encoder memory; each branch's self-attention reads
          its own copy of the committed cache with its window written in, as a chain window would.
  Step 4  accept, branch point: recursive rejection sampling without replacement (SpecInfer's multi-step
          speculative sampling, Miao et al. 2024 §4; Jeon et al. 2024, "Recursive Speculative Decoding", §3,
          RRS without replacement): with ``q^(1) = q_1`` (the target at the branch point), for ``j = 1..k``
          accept ``x^j`` if ``r_j · p^(j)(x^j) < q^(j)(x^j)`` (``r_j ~ U[0, 1)``), else
          ``q^(j+1) = norm(max(0, q^(j) − p^(j)))``; if every candidate is rejected, emit a sample of
          ``q^(k+1)``.
  Step 5  accept, along the kept branch ``a``: the single-draft rule (token or block verification) on
          ``x^a_2..x^a_g`` with the branch's ``p`` and ``q``: accepted drafts and the next token.
  Step 6  commit: branch ``a``'s window keys/values into the target's cache, branch ``a``'s row of the draft's
          copies back as the draft's cache (fixed shapes), the tokens as in single-draft decoding.

Exactness (the output has the warped target's distribution). Claim: for any target ``Q`` and any way of
drawing candidates where candidate ``j`` given the earlier ones is distributed ``P_j``, step 4 emits ``Y ~ Q``.
Induction on the candidates left: none left, ``Y ~ Q`` by construction. Otherwise, given ``x = x^1 ~ P_1``,
``P(Y = y) = P_1(y) min(1, Q(y)/P_1(y)) + P(reject) · Q'(y)``, where ``Q' = norm(max(0, Q − P_1))`` is the
law of the rest given a rejection — by induction, whatever ``x`` was, since the rest only changes which
``P_j`` the later candidates come from. ``P(reject) = 1 − Σ min(P_1, Q) = Σ max(0, Q − P_1)``, so
``P(Y = y) = min(P_1(y), Q(y)) + max(0, Q(y) − P_1(y)) = Q(y)`` (Leviathan et al. 2023, Appendix A.1, applied
once per candidate). Given the kept candidate, its continuation was drafted from the draft conditioned on it
alone (independent of the other branches and of step 4's coins), so step 5 is single-draft speculative sampling
from there, exact by Leviathan et al. 2023 (token) or Sun et al. 2025, Theorem 1 (block). The tests check the
rule by exact enumeration and the whole decode by chi-square against the target's exact sequence distribution.

At temperature 0 (one-hot ``p^(j)`` at each candidate, one-hot ``q``) step 4 keeps the first branch whose
candidate is the target's argmax, if any, and step 5 is greedy acceptance: the output is target-greedy, token for
token, since a branch window's logits are the target alone's step's bit for bit on the float32 and bfloat16 paths
(``specjax.models.t5.decode_branches``; ``tests/test_window_invariance.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specjax.decoding.block import block_verify
from specjax.decoding.drafts import ModelDraft, _draw_greedy, _draw_sampled, decoder_input_at
from specjax.decoding.inputs import MAX_DRAFTS
from specjax.decoding.verify import Verdict, token_verify
from specjax.sampling import SamplingParams, argmax, overlap, residual, sample_rows

__all__ = [
    "BranchProposal",
    "BranchDraft",
    "draw_candidates",
    "recursive_reject",
    "branch_verify",
    "MAX_DRAFTS",
]


class BranchProposal(NamedTuple):
    """The draft's ``k`` continuations of one iteration.

    Attributes:
      tokens: int32[b, k, g]; ``tokens[:, j, 0]`` is candidate ``x^j`` (distinct per row), ``tokens[:, j, 1:]``
        its continuation.
      probs: float32[b, k, g, v]; ``probs[:, j, 0]`` is ``p^(j)``, the distribution candidate ``j`` was drawn
        from given the earlier candidates (step 1), ``probs[:, j, i]`` the draft's distribution the ``i``-th
        token of branch ``j`` was drawn from. Zeros (unused) when every row is greedy.
      valid: bool[b, k], candidates that exist (``p`` had enough tokens); invalid ones are never accepted.
    """

    tokens: jax.Array
    probs: jax.Array
    valid: jax.Array


def _candidate_laws(p, x):
    """p float32[b, v], candidates x int32[b, k] -> (p^(j) float32[b, k, v]: p without x^1..x^{j-1},
    renormalised (zeros when nothing is left), valid bool[b, k]: p^(j)(x^j) > 0)."""
    b, k = x.shape
    v = p.shape[-1]
    taken = jnp.zeros((b, v), bool)
    laws, valid = [], []
    for j in range(k):
        rest = jnp.where(taken, 0.0, p)
        total = jnp.sum(rest, axis=-1, keepdims=True)
        law = jnp.where(total > 0, rest / jnp.where(total > 0, total, 1.0), 0.0)
        laws.append(law)
        valid.append(jnp.take_along_axis(law, x[:, j : j + 1], axis=1)[:, 0] > 0)
        taken = taken | jax.nn.one_hot(x[:, j], v, dtype=bool)
    return jnp.stack(laws, axis=1), jnp.stack(valid, axis=1)


def draw_candidates(keys, logits, sampling: SamplingParams, k: int):
    """Step 1: ``k`` distinct candidates per row and the law each was drawn from.

    Sampled rows: Gumbel-top-k over ``log p`` (``p`` the warped draft distribution; Kool et al. 2019), i.e. a
    draw without replacement; greedy rows (temperature 0): the ``k`` largest logits (the first is the argmax,
    ties to the lower index), each with a point-mass law.

    Args:
      keys: uint32[b, 2]. logits: float[b, v], the draft's at the branch point. k: static, <= v.
    Returns:
      (x int32[b, k], laws float32[b, k, v] (``p^(j)``), valid bool[b, k]).
    """
    v = logits.shape[-1]
    p = sampling.probs(logits)  # [b, v]; one-hot on greedy rows
    gumbel = jax.vmap(lambda key: jax.random.gumbel(key, (v,), jnp.float32))(keys)  # [b, v]
    scores = jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)) + gumbel, -jnp.inf)
    _, sampled = jax.lax.top_k(scores, k)
    _, top = jax.lax.top_k(logits.astype(jnp.float32), k)
    greedy = (sampling.temperature <= 0)[:, None]
    x = jnp.where(greedy, top, sampled).astype(jnp.int32)
    laws, valid = _candidate_laws(p, x)
    point = jax.nn.one_hot(x, v, dtype=jnp.float32)
    return x, jnp.where(greedy[..., None], point, laws), valid | greedy


def _top_candidates(logits, k: int):
    """Every row greedy: the draft's top-k tokens int32[b, k] (laws left as zeros, all valid)."""
    _, top = jax.lax.top_k(logits.astype(jnp.float32), k)
    b, v = logits.shape
    return top.astype(jnp.int32), jnp.zeros((b, k, v), jnp.float32), jnp.ones((b, k), bool)


def _row_keys(keys, k: int):
    """uint32[b, 2] -> uint32[b · k, 2]: k keys per row, each row's from its own key."""
    return jax.vmap(lambda key: jax.random.split(key, k))(keys).reshape(-1, keys.shape[-1])


@dataclasses.dataclass(frozen=True)
class BranchDraft:
    """A draft model proposing ``num_drafts`` continuations per row (steps 1-2 of the module docstring).

    Its carry and cache invariant are ``ModelDraft``'s (``drafts.py``): after ``keep``, the draft's cache
    holds the kept branch's tokens, exactly what single-draft drafting of those tokens leaves.

    Attributes:
      model: the draft's ``BranchDecodingModel``.
      num_drafts: ``k`` >= 2 (static).
    """

    model: Any
    num_drafts: int

    def start(self, params, encoder_input_tokens, cache_length):
        """((encoded [b rows], encoded copied per branch [b · k rows]), (empty cache, limit int32[b] zeros)).
        The copy of the draft's encoder memory is made once per call."""
        b = encoder_input_tokens.shape[0]
        encoded = self.model.encode(params, encoder_input_tokens)
        return (encoded, self.model.fork_rows(encoded, self.num_drafts)), (
            self.model.init_cache(b, cache_length),
            jnp.zeros((b,), jnp.int32),
        )

    def propose(self, params, context, carry, sequences, positions, keys, sampling, gamma):
        """keys uint32[g, b, 2] -> (``BranchProposal``, carry of the branches: (cache of b · k rows, limit)).

        The first step (``ModelDraft._catch_up``) runs on the ``b`` rows; its cache is then copied to
        ``b · k`` rows (``fork_rows``), and the ``g − 1`` further steps run on those."""
        encoded, encoded_k = context
        cache, limit = carry
        n, b, k = positions, positions.shape[0], self.num_drafts
        first_logits, cache = ModelDraft(self.model)._catch_up(params, encoded, cache, sequences, n, limit)
        forked = self.model.fork_rows(cache, k)
        branch_keys = jnp.stack([_row_keys(keys[i], k) for i in range(1, gamma)]) if gamma > 1 else None

        def steps(draw, candidates, cache):
            x1, laws, valid = candidates(keys[0], first_logits)
            if gamma == 1:
                return x1[..., None], laws[:, :, None], valid, cache

            def step(carry, key):
                cache, x_prev, pos = carry  # x_prev [b · k] sits at decoder position pos [b · k]
                logits, cache = self.model.decode(params, encoded_k, x_prev[:, None], cache, pos)
                x, p = draw(key, logits[:, 0], branch_sampling)
                return (cache, x, pos + 1), (x, p)

            pos = jnp.repeat(n + 1, k)
            (cache, _, _), (xs, ps) = jax.lax.scan(step, (cache, x1.reshape(-1), pos), branch_keys)
            rest = jnp.swapaxes(xs, 0, 1).reshape(b, k, gamma - 1)  # [b, k, g - 1]
            rest_p = jnp.swapaxes(ps, 0, 1).reshape(b, k, gamma - 1, -1)  # [b, k, g - 1, v]
            tokens = jnp.concatenate([x1[..., None], rest], axis=2)
            probs = jnp.concatenate([laws[:, :, None], rest_p], axis=2)
            return tokens, probs, valid, cache

        branch_sampling = SamplingParams(*(jnp.repeat(jnp.asarray(f), k) for f in sampling))
        tokens, probs, valid, forked = jax.lax.cond(
            sampling.all_greedy(),
            lambda c: steps(_draw_greedy, lambda key, lg: _top_candidates(lg, k), c),
            lambda c: steps(_draw_sampled, lambda key, lg: draw_candidates(key, lg, sampling, k), c),
            forked,
        )
        return BranchProposal(tokens, probs, valid), (forked, n + gamma)

    def keep(self, carry, branch):
        """The branches' carry and the kept branch int32[b] -> the draft's carry (cache of b rows, limit)."""
        forked, limit = carry
        b = branch.shape[0]
        rows = jnp.arange(b, dtype=jnp.int32) * self.num_drafts + branch
        return self.model.take_rows(forked, rows), limit

    def window(self, sequences, positions, proposal: BranchProposal, pad_id: int):
        """The target's branch windows int32[b, k, w]: ``[d[n], x^j_1..x^j_g]`` for each branch ``j``."""
        last = decoder_input_at(sequences, positions, pad_id)  # [b]
        b, k, _ = proposal.tokens.shape
        return jnp.concatenate([jnp.broadcast_to(last[:, None, None], (b, k, 1)), proposal.tokens], axis=2)


def recursive_reject(keys, x, laws, valid, q):
    """Step 4, recursive rejection sampling without replacement at the branch point, every row.

    Args:
      keys: uint32[b, 2]. x: int32[b, k] candidates; laws: float32[b, k, v] ``p^(j)``, the law candidate ``j``
        was drawn from given the earlier ones; valid: bool[b, k]. q: float32[b, v], the target's warped
        distribution at the branch point.
    Returns:
      (kept int32[b]: the first accepted candidate, ``k`` if none; fallback int32[b]: a sample of the final
      residual ``q^(k+1)``, the token to emit when none is accepted).
    """
    b, k = x.shape
    accept_keys, fallback_keys = jnp.swapaxes(jax.vmap(lambda key: jax.random.split(key, 2))(keys), 0, 1)
    r = jax.vmap(lambda key: jax.random.uniform(key, (k,), jnp.float32))(accept_keys)  # [b, k]
    kept = jnp.full((b,), k, jnp.int32)
    q_j = q
    for j in range(k):  # k is small and static: unrolled
        p_j = laws[:, j]
        p_x = jnp.take_along_axis(p_j, x[:, j : j + 1], axis=1)[:, 0]
        q_x = jnp.take_along_axis(q_j, x[:, j : j + 1], axis=1)[:, 0]
        ok = valid[:, j] & (p_x > 0) & (r[:, j] * p_x < q_x)
        kept = jnp.where((kept == k) & ok, j, kept)
        q_j = jnp.where(valid[:, j, None], residual(p_j, q_j), q_j)  # q^(j+1); only read while none is kept
    return kept, sample_rows(fallback_keys, q_j)


def _chain(verification: str, keys, drafted, p, q):
    """Step 5 on the kept branch: drafted int32[b, g−1], p float32[b, g−1, v], q float32[b, g, v] ->
    (accepted int32[b], next token int32[b], beta float32[b, g−1]), token or block verification."""
    b, rest = drafted.shape
    if rest == 0:  # gamma 1: the branch point was the only draft; the next token is the bonus
        return jnp.zeros((b,), jnp.int32), sample_rows(keys, q[:, 0]), jnp.zeros((b, 0), jnp.float32)
    rule = block_verify if verification == "block" else token_verify
    return rule(keys, drafted, p, q)


def _pick(x, branch):
    """x [b, k, ...], branch int32[b] -> x[:, branch] [b, ...]."""
    idx = branch.reshape((-1,) + (1,) * (x.ndim - 1))
    return jnp.take_along_axis(x, idx, axis=1)[:, 0]


def _greedy_branch_verdict(proposal: BranchProposal, target_logits):
    """Every row at temperature 0: keep the first branch whose candidate is the target's argmax, then accept
    while its drafts equal the target's argmax; the next token is the target's argmax. -> (branch, Verdict)."""
    b, k, g = proposal.tokens.shape
    target_tokens = argmax(target_logits)  # [b, k, w]
    root = target_tokens[:, 0, 0]
    match = proposal.tokens[:, :, 0] == root[:, None]  # [b, k]
    found = jnp.any(match, axis=1)
    branch = jnp.where(found, jnp.argmax(match, axis=1), 0).astype(jnp.int32)
    tokens, targets = _pick(proposal.tokens, branch), _pick(target_tokens, branch)  # [b, g], [b, w]
    agree = (targets[:, :g] == tokens) & found[:, None]
    num_accepted = jnp.sum(jnp.cumprod(agree.astype(jnp.int32), axis=1), axis=1)
    next_token = jnp.take_along_axis(targets, num_accepted[:, None], axis=1)[:, 0]
    beta = agree.astype(jnp.float32).at[:, 0].set((proposal.tokens[:, 0, 0] == root).astype(jnp.float32))
    return branch, Verdict(num_accepted.astype(jnp.int32), next_token, beta)


def _sampled_branch_verdict(keys, proposal: BranchProposal, target_logits, sampling: SamplingParams, verification):
    b, k, g = proposal.tokens.shape
    root_keys, chain_keys = jnp.swapaxes(jax.vmap(lambda key: jax.random.split(key, 2))(keys), 0, 1)
    q = sampling.probs(target_logits)  # [b, k, w, v]
    q_root = q[:, 0, 0]
    x = proposal.tokens[:, :, 0]
    laws = proposal.probs[:, :, 0]
    kept, fallback = recursive_reject(root_keys, x, laws, proposal.valid, q_root)
    found = kept < k
    branch = jnp.where(found, kept, 0).astype(jnp.int32)
    tokens, p, q_b = _pick(proposal.tokens, branch), _pick(proposal.probs, branch), _pick(q, branch)
    rest_accepted, rest_next, rest_beta = _chain(verification, chain_keys, tokens[:, 1:], p[:, 1:], q_b[:, 1:])
    num_accepted = jnp.where(found, 1 + rest_accepted, 0).astype(jnp.int32)
    next_token = jnp.where(found, rest_next, fallback)
    beta = jnp.concatenate([overlap(laws[:, 0], q_root)[:, None], rest_beta], axis=1)  # [b, g]
    return branch, Verdict(num_accepted, next_token, beta)


def branch_verify(keys, proposal: BranchProposal, target_logits, sampling: SamplingParams, verification: str):
    """Steps 4-5: which branch is kept and the ``Verdict`` along it.

    Args:
      keys: uint32[b, 2]. proposal: ``BranchProposal``. target_logits: float[b, k, w, v] (``decode_branches``).
      sampling: per-row warping (applied to q as it was to p). verification: "token" or "block" (step 5).
    Returns:
      (branch int32[b]: the kept branch, 0 when no candidate was accepted; ``Verdict`` whose drafts are the kept
      branch's: ``num_accepted`` in [0, g] (0: no candidate accepted, ``next_token`` from the final residual),
      ``beta`` float32[b, g]: β of the first candidate's law at the branch point, then along the kept branch).
    When every row is greedy a ``lax.cond`` takes the argmax rule (``_greedy_branch_verdict``), the same result.
    """
    return jax.lax.cond(
        sampling.all_greedy(),
        lambda _: _greedy_branch_verdict(proposal, target_logits),
        lambda _: _sampled_branch_verdict(keys, proposal, target_logits, sampling, verification),
        None,
    )

"""``Decoder``: speculative sampling that picks γ — or no draft at all — from measured costs and the running α.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``T`` max_decode_length, ``g`` gamma.

It lives above the decode loops, on the host (DESIGN.md, "Platforms and policy"): each call runs one of the
unchanged programs — ``temperature_sample`` (γ = 0, the target alone) or ``speculative_sample`` at γ in
1..8 — so every choice is exact (the output distribution is the target's for every γ; at temperature 0 the
output equals the target's greedy decode token for token).

The choice (Leviathan et al. 2023, section 3.1 and 3.4). For each candidate γ, the predicted tokens per second
at this batch shape are ``tokens / seconds(γ)`` with

    seconds(γ) = factor(kind of γ) · (encode(γ) + iterations(α, γ) · iteration(γ)),
    iteration(0) = target step,   iteration(γ) = target window of γ + 1 tokens + γ · draft step,

``iterations(α, γ)`` the expected loop iterations of a call: the loop runs until its slowest row is done, and
a row of ``L`` tokens takes the iterations whose emitted tokens first reach ``L``, each iteration emitting
``min(A + 1, tokens left)`` with ``A`` the accepted draft tokens, ``P(A >= j) = α^j`` for ``j <= γ`` (the paper's
i.i.d. model, §3.1, whose mean ``A + 1`` is E(α, γ) = (1 − α^(γ+1)) / (1 − α)); ``E[max over rows]`` is
computed exactly under that model for the row lengths of the last calls at this batch size
(``expected_iterations``), so a batch's slowest row and each row's short last window are counted (``n / E(α,
γ)`` for the longest row ``n`` counts neither: at batch 4 it put γ 8 first where γ 3 ran fastest). γ 0 takes
the longest row's length. ``tokens`` is the mean tokens of those calls, ``α`` the running acceptance rate, and
the costs (seconds) measured once per machine and shape with the models' real decode functions jitted alone (with the
XLA:CPU options the loop of that γ compiles with) and cached on disk (``specjax.hardware.CostCache``).
``factor`` is what the jitted-alone costs miss, learned from finished calls: the median, over the last calls of
that kind at this batch size, of measured wall time / this formula's time for the call (with the call's own loop
iterations, read from its ``DecodeResult``: no α or length noise). There are two kinds, the target alone (γ 0)
and speculative (every γ >= 1: the loop's accept/commit work, the draft's catch-up windows, dispatch), so the
choice between speculative γ follows the smooth cost model and α, not one call's timing; a kind not run yet at this
batch size borrows the other's factor, so a busy moment of a shared machine, which slows every program alike,
does not drive the choice to the program not yet timed. Every ``EXPLORE_EVERY`` calls at a batch size, the best
γ of the other kind is run once when it is predicted within ``EXPLORE_WITHIN`` of the best and has not run for
that long, so a factor learned in a busy moment is renewed. A program's first call compiles: its wall time is
never used, so compile time is never charged to a choice (it still teaches α).

Multi-draft verification (``speculative_sample(..., num_drafts=k)``). With ``gamma="auto"`` and ``num_drafts="auto"``
(or a fixed k > 1) γ and k are chosen together: for each k > 1 in ``NUM_DRAFTS_CANDIDATES`` and γ >= 1,

    seconds(γ, k) = factor(k drafts) · (encode(γ) + iterations · (branch window(γ, k) + draft step + (γ − 1) ·
                    draft step on b · k rows)),

the k-branch window (``decode_branches``, k · (γ + 1) rows per row) and the draft's step on b · k rows measured
with the rest (``measure_costs(..., num_drafts=...)``), the iterations under the same model with the first draft
position accepted with ``α · lift(k)`` and the later ones with α (``expected_iterations_table(..., first=)``):
``lift(k)`` is the first position's accepted iterations per iteration in calls of k drafts over that in calls of
one (greedy and sampled rows apart), 1 until both have run. So before a k > 1 has run it is predicted slower than
one draft (more cost, no gain) and one draft is chosen; every ``EXPLORE_EVERY`` calls at a batch size a k-draft kind
never run there is explored (and rerun right after, its first call having compiled, to time it), and then k > 1 runs
whenever it is predicted faster. ``factor(k drafts)`` is learned from its own calls (the single-draft factor until
then). On a 2-core AMD EPYC (Zen 4) k = 2 and 4 raised tokens per target call 1.11-1.29× but lowered tokens/s
(``benchmarks/results/multi_draft/``): there one draft stays the choice.

With a fixed γ, ``num_drafts="auto"`` chooses k from measured tokens/s of finished calls (programs that did not
compile) at this batch size and γ: one draft unless a k > 1 has measured faster; every ``EXPLORE_EVERY`` calls the
least measured k > 1 runs once (and once more right after, when that first run compiled).

α starts from a prior — the shipped pair's recorded α (``specjax.defaults.PAIR_ALPHA``), else 0.6 — and is
updated after every finished call from its ``DecodeResult`` (the paper's α: Σ β / Σ verified positions), with
greedy rows (temperature 0) and sampled rows kept apart: a call's α is their mix by row count.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import numpy as np

from specjax import hardware
from specjax.decoding import speculative_sample, temperature_sample
from specjax.gamma_auto import (  # noqa: F401  (re-exported: the cost model's names, as before)
    BRANCH_WINDOWS_MEASURED,
    WINDOWS_MEASURED,
    Choice,
    Costs,
    _kind,
    _model_digest,
    _model_seconds,
    _Running,
    expected_iterations,
    expected_iterations_table,
    expected_tokens,
    expected_tokens_multi,
    fingerprint,
    measure_costs,
    recorded_alpha,
)

__all__ = [
    "CANDIDATES",
    "NUM_DRAFTS_CANDIDATES",
    "DEFAULT_ALPHA",
    "EXPLORE_EVERY",
    "EXPLORE_WITHIN",
    "Costs",
    "Choice",
    "Decoder",
    "expected_iterations",
    "expected_iterations_table",
    "expected_tokens",
    "expected_tokens_multi",
    "measure_costs",
    "BRANCH_WINDOWS_MEASURED",
]

CANDIDATES = tuple(range(9))
"""The γ values ``gamma="auto"`` chooses from: 0 (the target alone) and 1..8 draft tokens per iteration."""
NUM_DRAFTS_CANDIDATES = (1, 2, 4)
"""The draft continuations per target call ``num_drafts="auto"`` chooses from (1: single-draft decoding)."""
DEFAULT_ALPHA = 0.6
"""The α prior for a pair with no recorded α."""
_PRIOR_WEIGHT = 40.0  # verified positions the prior counts for
_RECENT = 8  # calls whose time factor a kind of program keeps, and whose row lengths a batch size keeps
EXPLORE_EVERY = 16
"""auto runs the best γ of the kind (target alone / speculative) it has not run for this many calls at a batch
size once, when that γ is predicted within ``EXPLORE_WITHIN`` of the best: its learned factor is renewed."""
EXPLORE_WITHIN = 0.8
"""The least predicted tokens/s, as a fraction of the best, at which the other kind is explored."""
SWITCH_MARGIN = 0.05
"""auto keeps the γ of its previous call at the same batch size unless another is predicted this much faster
(a fraction): predictions a few per cent apart are within a shared machine's noise, and every new γ compiles
another program."""


class Decoder:
    """Speculative sampling with γ chosen per call (``gamma="auto"``) or fixed, keeping what it learns.

    ``Decoder(target, draft, gamma="auto", max_decode_length=64)(tokens, temperature=0.0)`` decodes like
    ``specjax.speculative_sample`` (or ``temperature_sample`` when γ is 0) and returns its ``DecodeResult``.
    With ``gamma="auto"`` each call predicts tokens/s for every γ in ``candidates`` from measured costs and the
    running α (this module's docstring) and runs the best; ``last_choice`` says what ran and why. The choice
    never changes what is sampled, only how fast: every γ's output has the target's distribution, and greedy
    rows equal the target alone token for token.

    Args:
      target: a ``T5Model`` or ``(DecodingModel, params)``.
      draft: a draft model (the target's vocabulary), a draft source (``PromptLookupDraft``), or None (the
        target alone; only ``gamma=0`` or "auto", which then always picks 0).
      gamma: "auto", or an int >= 0 (0: the target alone, ``temperature_sample``).
      max_decode_length: ``T``, the most output tokens per row.
      eos_id, max_input_length, truncate, verification, draft_confidence_threshold: as ``speculative_sample``.
      num_drafts: as ``speculative_sample`` (1..4, draft continuations per target call) for every speculative
        call, or "auto": chosen per call among ``NUM_DRAFTS_CANDIDATES`` (module docstring; one draft until a
        k > 1 is predicted or measured faster); with ``gamma="auto"`` γ and k are chosen together from measured
        costs, and a fixed k > 1 has γ chosen for it. ``last_num_drafts`` says what the last call ran.
      candidates: the γ values "auto" picks from (default 0..8).
      alpha_prior: the α to start from: a float or (greedy, sampled); None: the shipped pair's recorded α
        (``recorded_alpha``), else ``DEFAULT_ALPHA``.
      cost_cache: a ``specjax.hardware.CostCache``, None (the default file, ``$SPECJAX_CACHE_DIR``), or False
        (measure in memory only).
      costs: {batch size: ``Costs``} to use instead of measuring (tests, or costs measured elsewhere).
    Raises:
      ValueError: a gamma that is not "auto" or an int >= 0; a draft of None with gamma >= 1; a draft
        ``speculative_sample`` refuses (another vocabulary or pad id; checked here, with every γ); candidates
        outside 0..8 or empty; alpha_prior outside [0, 1]; num_drafts not "auto" nor in 1..4.
    """

    def __init__(
        self,
        target,
        draft,
        *,
        gamma: int | str = "auto",
        max_decode_length: int,
        eos_id: int = 1,
        max_input_length: int = 512,
        truncate: bool = False,
        verification: str = "token",
        draft_confidence_threshold: float | None = None,
        num_drafts: int | str = 1,
        candidates: Sequence[int] = CANDIDATES,
        alpha_prior: float | tuple[float, float] | None = None,
        cost_cache: hardware.CostCache | None | bool = None,
        costs: dict | None = None,
    ):
        if not (gamma == "auto" or (isinstance(gamma, int) and not isinstance(gamma, bool) and gamma >= 0)):
            raise ValueError(f"gamma must be 'auto' or an int >= 0 (0: the target alone), got {gamma!r}.")
        if num_drafts != "auto" and (
            isinstance(num_drafts, bool) or not isinstance(num_drafts, int) or not 1 <= num_drafts <= 4
        ):
            raise ValueError(f"num_drafts must be 'auto' or an int in [1, 4] (1: one draft), got {num_drafts!r}.")
        if draft is None and gamma not in ("auto", 0):
            raise ValueError(f"gamma={gamma} needs a draft; pass draft= or use gamma=0 (the target alone).")
        candidates = tuple(sorted({int(g) for g in candidates})) if draft is not None else (0,)
        if not candidates or min(candidates) < 0 or max(candidates) > max(CANDIDATES):
            raise ValueError(f"candidates must be γ values in 0..{max(CANDIDATES)}, got {candidates!r}.")
        if alpha_prior is None:
            alpha_prior = (recorded_alpha(target, draft) if draft is not None else None) or DEFAULT_ALPHA
        prior = (alpha_prior, alpha_prior) if isinstance(alpha_prior, (int, float)) else tuple(alpha_prior)
        if len(prior) != 2 or not all(0.0 <= float(a) <= 1.0 for a in prior):
            raise ValueError(f"alpha_prior must be in [0, 1] (or a (greedy, sampled) pair), got {alpha_prior!r}.")
        if draft is not None:  # a draft the loop would refuse (another vocabulary …) is refused now, before any γ
            # auto measures costs with it or picks the target alone around it
            speculative_sample.check_arguments(
                target,
                draft,
                np.array([[1]], np.int32),
                gamma=1,
                max_decode_length=max_decode_length,
                eos_id=eos_id,
                verification=verification,
                draft_confidence_threshold=draft_confidence_threshold,
                **({"num_drafts": num_drafts} if isinstance(num_drafts, int) and num_drafts > 1 else {}),
            )
        self.target, self.draft, self.gamma = target, draft, gamma
        self.max_decode_length = max_decode_length
        self.settings = dict(eos_id=eos_id, max_input_length=max_input_length, truncate=truncate)
        self.spec_settings = dict(verification=verification, draft_confidence_threshold=draft_confidence_threshold)
        self.num_drafts = num_drafts
        # num_drafts > 1 needs a draft model drafting γ tokens: "auto" stays at 1 for anything else
        self._can_branch = draft is not None and not hasattr(draft, "propose") and draft_confidence_threshold is None
        self._k_rates: dict = {}  # (b, γ, k) -> tokens/s of the last calls of k drafts that did not compile
        self._k_pending: dict = {}  # b -> a k > 1 (fixed γ) or (γ, k) (joint) whose explored call compiled: rerun
        # first draft position accepted / iterations, per k and greedy / sampled rows (the joint choice's lift)
        self._first: dict = {}
        self.last_num_drafts = 1
        self.candidates = candidates
        self.alpha_prior = (float(prior[0]), float(prior[1]))
        self._alpha = {"greedy": _Running(prior[0], _PRIOR_WEIGHT), "sampled": _Running(prior[1], _PRIOR_WEIGHT)}
        self.cost_cache = hardware.CostCache() if cost_cache is None else (cost_cache or None)
        self.costs: dict = dict(costs or {})
        self._factors: dict = {}  # (b, kind) -> the last calls' wall seconds / the formula's seconds
        self._calls: dict = {}  # b -> auto calls at this batch size
        self._kind_ran: dict = {}  # (b, kind) -> the index (in self._calls[b]) of the last call of that kind
        self._lengths: dict = {}  # b -> the row lengths (int[b], tokens) of the last calls at this batch size
        self._compiled: set = set()  # program keys that have run once (compiled)
        self._last_gamma: dict = {}  # b -> the γ auto ran last at this batch size
        self.last_choice: Choice | None = None
        self.last_compiled = False  # whether the last call was its program's first (it compiled)
        self.last_seconds = 0.0  # wall seconds of the last call (compilation included when it compiled)
        self.history: list = []  # (γ, seconds, tokens, α of the call) per call

    # --- what the decoder knows -----------------------------------------------------------------------------
    def alpha(self, greedy_fraction: float) -> float:
        """The running α for a call whose rows are ``greedy_fraction`` greedy (temperature 0), the rest sampled."""
        return greedy_fraction * self._alpha["greedy"].value + (1 - greedy_fraction) * self._alpha["sampled"].value

    def observe(self, greedy: bool, beta_sum: float, num_verified: float, lengths, batch: int) -> None:
        """Learns from finished rows decoded elsewhere (a bulk decode's slots, ``specjax.bulk``): adds their α sums
        (Σβ over ``num_verified`` verified positions, Leviathan et al. 2023 §3.1) to the running α of greedy or
        sampled rows, and their output lengths int[n] (tokens) to the recent lengths at ``batch`` rows."""
        if num_verified:
            self._alpha["greedy" if greedy else "sampled"].add(float(beta_sum), float(num_verified))
        recent = self._lengths.setdefault(batch, [])
        recent.append(np.asarray(lengths, np.int64))
        del recent[:-_RECENT]

    def mean_length(self) -> float | None:
        """The mean output length (tokens) of the recent rows at every batch size, None before any."""
        lengths = [x for xs in self._lengths.values() for x in xs]
        return float(np.mean(np.concatenate(lengths))) if lengths else None

    def _cost_key(self, tokens: np.ndarray) -> str:
        b, s = tokens.shape
        return hardware.CostCache.key(
            kind="decode-costs-v4",
            target=_model_digest(self.target),
            draft=_model_digest(self.draft) if self.draft is not None else None,
            batch=b,
            width=s,
            max_decode_length=self.max_decode_length,
            max_gamma=max(self.candidates),
            **({"num_drafts": list(self.branch_drafts())} if self.branch_drafts() else {}),
        )

    def costs_known(self, tokens) -> bool:
        """Whether ``costs_for(tokens)`` answers without measuring: costs given at construction or already measured
        at this batch size, or stored on disk (an earlier run on this machine) for this shape with every γ."""
        tokens = np.asarray(tokens)
        if tokens.shape[0] in self.costs:
            return True
        stored = self.cost_cache.get(self._cost_key(tokens)) if self.cost_cache is not None else None
        try:
            return stored is not None and self._covers(Costs.from_json(stored))
        except (KeyError, TypeError, ValueError):
            return False

    def _covers(self, costs: Costs) -> bool:
        """Whether ``costs`` hold every γ candidate and every k of ``branch_drafts``."""
        return costs.max_gamma >= max(self.candidates) and all(k in costs.branch for k in self.branch_drafts())

    def costs_for(self, tokens) -> Costs:
        """The ``Costs`` at this batch shape: given at construction, cached on disk, else measured now (once)."""
        tokens = np.asarray(tokens)
        b = tokens.shape[0]
        if b in self.costs:
            return self.costs[b]
        key = self._cost_key(tokens)
        stored = self.cost_cache.get(key) if self.cost_cache is not None else None
        costs = None
        if stored is not None:
            try:
                costs = Costs.from_json(stored)
            except (KeyError, TypeError, ValueError):
                costs = None
        if costs is None or not self._covers(costs):
            costs = measure_costs(
                self.target,
                self.draft if self.draft is not None else self.target,
                tokens,
                self.max_decode_length,
                max(self.candidates),
                num_drafts=self.branch_drafts(),
            )
            if self.cost_cache is not None:
                self.cost_cache.put(key, costs.to_json())
        self.costs[b] = costs
        return costs

    def predict(self, costs: Costs, alpha: float, batch: int) -> dict:
        """{γ: predicted tokens/s} for every candidate at this batch size (see the module docstring)."""
        recent = self._lengths.get(batch) or [np.full((batch,), max(self.max_decode_length // 2, 1))]
        tokens = float(np.mean([np.sum(x) for x in recent]))
        gammas = [g for g in self.candidates if g <= costs.max_gamma]
        iterations = expected_iterations_table(recent, alpha, gammas)
        return {g: tokens / max(_model_seconds(costs, g, iterations[g]) * self.factor(batch, g), 1e-12) for g in gammas}

    def factor(self, batch: int, gamma: int, num_drafts: int = 1) -> float:
        """Measured / modelled seconds for calls of ``gamma``'s kind (0: the target alone; >= 1: speculative; with
        ``num_drafts`` = k > 1: k drafts) at this batch size: the median of that kind's last calls; a kind not
        run yet borrows the other's (k drafts: the single-draft one first); 1.0 before any call. See the module
        docstring."""
        own = self._factors.get((batch, _kind(gamma, num_drafts)))
        if own:
            return float(np.median(own))
        if num_drafts > 1 and gamma > 0:
            return self.factor(batch, gamma)
        other = self._factors.get((batch, _kind(1 - min(gamma, 1))))
        return float(np.median(other)) if other else 1.0

    def branch_drafts(self) -> tuple[int, ...]:
        """The k > 1 a joint (γ, k) choice considers: ``NUM_DRAFTS_CANDIDATES`` beyond 1 for ``num_drafts="auto"``,
        the fixed k > 1, else none; none for a draft that cannot branch (prompt lookup, a confidence stop) or
        with a fixed γ (then ``num_drafts="auto"`` chooses k by measured tokens/s alone)."""
        if self.gamma != "auto" or not self._can_branch:
            return ()
        if self.num_drafts == "auto":
            return tuple(k for k in NUM_DRAFTS_CANDIDATES if k > 1)
        return (int(self.num_drafts),) if int(self.num_drafts) > 1 else ()

    def first_acceptance(self, num_drafts: int, greedy_fraction: float) -> float:
        """The chance the first draft position is accepted with ``num_drafts`` = k candidates at the branch point:
        the running α times the lift measured between k and one draft (the first position's accepted
        iterations / iterations, in calls of k against calls of 1, greedy and sampled rows apart); α itself for
        k = 1 and until both are measured. At most 1."""
        alpha = self.alpha(greedy_fraction)
        if num_drafts == 1:
            return alpha
        lift = 0.0
        for name, share in (("greedy", greedy_fraction), ("sampled", 1.0 - greedy_fraction)):
            one, many = self._first.get((1, name)), self._first.get((num_drafts, name))
            ratio = many.value / one.value if one is not None and many is not None and one.value > 0 else 1.0
            lift += share * ratio
        return min(1.0, alpha * lift)

    def predict_drafts(self, costs: Costs, greedy_fraction: float, batch: int, ks: Sequence[int]) -> dict:
        """{(γ, k): predicted tokens/s} for every speculative γ candidate and k in ``ks`` (> 1) whose costs were
        measured: ``tokens / (factor · (encode(γ) + iterations · iteration(γ, k)))``, the iterations with the
        first position accepted with ``first_acceptance(k)`` and the later ones with α (``expected_iterations_table``),
        ``factor`` that of the k-draft calls (borrowing the single-draft one until they have run)."""
        recent = self._lengths.get(batch) or [np.full((batch,), max(self.max_decode_length // 2, 1))]
        tokens = float(np.mean([np.sum(x) for x in recent]))
        alpha = self.alpha(greedy_fraction)
        gammas = [g for g in self.candidates if 1 <= g <= costs.max_gamma]
        out = {}
        for k in ks:
            if k not in costs.branch or not gammas:
                continue
            iterations = expected_iterations_table(recent, alpha, gammas, self.first_acceptance(k, greedy_fraction))
            for g in gammas:
                seconds = _model_seconds(costs, g, iterations[g], k) * self.factor(batch, g, k)
                out[(g, k)] = tokens / max(seconds, 1e-12)
        return out

    def choose(self, tokens, temperature) -> Choice:
        """The ``Choice`` for a call on ``tokens`` int[b, s] at ``temperature`` (float or float[b]); measures the
        costs of a new shape first. Fixed γ: no prediction."""
        tokens = np.asarray(tokens)
        b = tokens.shape[0]
        greedy = float(np.mean(np.broadcast_to(np.asarray(temperature, np.float64), (b,)) <= 0))
        alpha = self.alpha(greedy)
        if self.gamma != "auto":
            return Choice(int(self.gamma), {}, alpha, f"fixed γ {self.gamma}")
        if self.candidates == (0,):
            return Choice(0, {}, alpha, "auto: no draft, the target alone")
        costs = self.costs_for(tokens)
        predicted = self.predict(costs, alpha, b)
        ks = self.branch_drafts()
        multi = self.predict_drafts(costs, greedy, b, ks) if ks else {}
        if self.num_drafts != "auto" and ks:  # a fixed k > 1: its windows, or the target alone
            predicted = {g: v for g, v in predicted.items() if g == 0}
        joint = {(g, 1): v for g, v in predicted.items()} | multi  # (γ, k) -> tok/s
        pending = self._k_pending.pop(b, None) if ks else None
        if pending is not None and pending in joint:  # the explored (γ, k) compiled on its first call: time it
            why = f" ({pending[1]} drafts timed: the first call compiled)"
            return self._choice(joint, pending, predicted, multi, alpha, why)
        best = max(joint, key=joint.get)
        last = self._last_gamma.get(b)
        last = last if isinstance(last, tuple) else (last, 1)
        kept = last in joint and joint[best] <= joint[last] * (1 + SWITCH_MARGIN)
        if kept:
            best = last
        why = f" (kept: no γ predicted {SWITCH_MARGIN:.0%} faster)" if kept else ""
        calls = self._calls.get(b, 0)
        kinds = {}  # kind -> its best (γ, k)
        for key, v in joint.items():
            kind = _kind(*key)
            if kind != _kind(*best) and (kind not in kinds or v > joint[kinds[kind]]):
                kinds[kind] = key
        if kinds and calls >= EXPLORE_EVERY:
            # The stalest kind first; a k-draft kind never run at this batch size is explored whatever its
            # prediction (its lift and factor are not measured yet), the others when predicted close to the best.
            for kind, alt in sorted(kinds.items(), key=lambda kv: self._kind_ran.get((b, kv[0]), -1)):
                stale = calls - self._kind_ran.get((b, kind), -1) > EXPLORE_EVERY
                unmeasured = alt[1] > 1 and (b, kind) not in self._kind_ran
                if stale and (unmeasured or joint[alt] >= EXPLORE_WITHIN * joint[best]):
                    best, why = alt, f" (explored: the {kind} had not run for {EXPLORE_EVERY} calls)"
                    break
        return self._choice(joint, best, predicted, multi, alpha, why)

    def _choice(self, joint: dict, best: tuple, predicted: dict, multi: dict, alpha: float, why: str) -> Choice:
        """The ``Choice`` of (γ, k) ``best`` among ``joint`` {(γ, k): tok/s}, with its one-line reason."""
        g, k = best
        base = predicted.get(0)
        vs = f", {joint[best] / base:.2f}x the target alone" if base else ""
        what = "the target alone" if g == 0 else f"γ {g}" + (f" with {k} drafts" if k > 1 else "")
        reason = f"auto: {what} predicted {joint[best]:.0f} tok/s{vs} (α {alpha:.3f}){why}"
        return Choice(g, predicted, alpha, reason, k, multi)

    # --- a call ---------------------------------------------------------------------------------------------
    def __call__(self, encoder_input_tokens, *, rng=None, temperature=1.0, top_k=0, top_p=1.0, gamma=None):
        """Decodes ``encoder_input_tokens`` int[b, s] (right-padded with ``pad_id``) and learns from the call.

        Args:
          rng, temperature, top_k, top_p: as ``speculative_sample`` (concrete values: the decoder is host code).
          gamma: None (the decoder's choice), or an int in 0..8 forcing this call's γ (it still learns from it).
        Returns:
          ``DecodeResult`` of the program run (``last_choice`` says which).
        Raises:
          ValueError: everything ``speculative_sample`` / ``temperature_sample`` refuse; a forced gamma that
            is not an int >= 0, or >= 1 without a draft.
        """
        tokens = np.asarray(encoder_input_tokens)
        if tokens.ndim != 2 or tokens.shape[0] < 1:
            raise ValueError(f"encoder_input_tokens must be int[b, s] with b >= 1, got shape {tokens.shape}.")
        if gamma is not None:
            if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or gamma < 0:
                raise ValueError(f"gamma must be None or an int >= 0 (0: the target alone), got {gamma!r}.")
            if gamma > 0 and self.draft is None:
                raise ValueError(f"gamma={gamma} needs a draft; this Decoder has none (use gamma=0).")
            b = tokens.shape[0]
            greedy = float(np.mean(np.broadcast_to(np.asarray(temperature, np.float64), (b,)) <= 0))
            choice = Choice(int(gamma), {}, self.alpha(greedy), f"forced γ {int(gamma)}")
        else:
            choice = self.choose(tokens, temperature)
        g = choice.gamma
        if self.branch_drafts():  # γ and k chosen together (or a fixed k > 1 with γ auto)
            k = choice.num_drafts if gamma is None else (1 if self.num_drafts == "auto" else int(self.num_drafts))
            k, why = (k if g > 0 else 1), ""
        else:
            k, why = self._choose_num_drafts(tokens.shape[0], g)
        if why:
            choice = dataclasses.replace(choice, reason=f"{choice.reason}; {why}")
        sampling = dict(rng=rng, temperature=temperature, top_k=top_k, top_p=top_p)
        t0 = time.perf_counter()
        if g == 0:
            result = temperature_sample(
                self.target, tokens, max_decode_length=self.max_decode_length, **sampling, **self.settings
            )
        else:
            result = speculative_sample(
                self.target,
                self.draft,
                tokens,
                gamma=g,
                max_decode_length=self.max_decode_length,
                **sampling,
                **self.settings,
                **self.spec_settings,
                **(dict(num_drafts=k) if k > 1 else {}),
            )
        jax.block_until_ready(result)  # a DecodeResult is a pytree: wait for every field before the clock stops
        seconds = time.perf_counter() - t0
        self.last_choice, self.last_num_drafts = choice, k
        if self.gamma == "auto":
            self._note_run(tokens.shape[0], choice, forced=gamma is not None, num_drafts=k)
        self._learn(tokens, temperature, g, jax.device_get(result), seconds, k)
        return result

    def _choose_num_drafts(self, batch: int, gamma: int) -> tuple[int, str]:
        """(k, why) for a call of γ ``gamma`` at ``batch`` rows: the fixed ``num_drafts``; with "auto" the k of the
        best median measured tokens/s at (batch, γ) (1 until a k > 1 is measured faster), or a k > 1 explored
        (``EXPLORE_EVERY``), or one whose explored call compiled and is now timed."""
        if self.num_drafts != "auto":
            return int(self.num_drafts), ""
        if gamma == 0 or not self._can_branch:
            return 1, ""
        pending = self._k_pending.pop(batch, None)
        if pending is not None:
            return pending, f"num_drafts {pending} timed (its first call compiled)"
        rates = {
            k: float(np.median(self._k_rates[(batch, gamma, k)]))
            for k in NUM_DRAFTS_CANDIDATES
            if self._k_rates.get((batch, gamma, k))
        }
        best = max(rates, key=rates.get) if 1 in rates else 1
        calls = self._calls.get(batch, 0) if self.gamma == "auto" else len(self.history)
        if calls and calls % EXPLORE_EVERY == 0:
            others = [k for k in NUM_DRAFTS_CANDIDATES if k != best]
            explore = min(others, key=lambda k: (len(self._k_rates.get((batch, gamma, k), [])), k))
            return explore, f"num_drafts {explore} explored (best measured: {best})"
        measured = " ".join(f"{k}:{v:.0f}" for k, v in sorted(rates.items()))
        return best, f"num_drafts {best}" + (f" (measured tok/s by k {measured})" if measured else "")

    def _note_run(self, batch: int, choice: Choice, forced: bool, num_drafts: int = 1) -> None:
        """Books an auto decoder's call at ``batch`` rows: the γ (and k) to keep (not a forced or an explored one),
        the call count and when each kind last ran (for ``EXPLORE_EVERY``)."""
        if not forced and "(explored:" not in choice.reason:
            self._last_gamma[batch] = (choice.gamma, num_drafts) if num_drafts > 1 else choice.gamma
        self._kind_ran[(batch, _kind(choice.gamma, num_drafts))] = self._calls.get(batch, 0)
        self._calls[batch] = self._calls.get(batch, 0) + 1

    def _learn(self, tokens: np.ndarray, temperature, gamma: int, result, seconds: float, num_drafts: int = 1) -> None:
        """Updates α (per greedy / sampled rows), the recent row lengths and, for a program that had already
        compiled, the time factor of ``gamma``'s kind (single-draft calls) and the measured tokens/s of
        ``num_drafts`` at this batch size and γ (``num_drafts="auto"``)."""
        b = tokens.shape[0]
        temps = np.broadcast_to(np.asarray(temperature, np.float64), (b,))
        beta, verified = np.asarray(result.beta_sum, np.float64), np.asarray(result.num_verified, np.float64)
        for name, rows in (("greedy", temps <= 0), ("sampled", temps > 0)):
            if rows.any() and verified[rows].sum() > 0:
                self._alpha[name].add(float(beta[rows].sum()), float(verified[rows].sum()))
        lengths = np.asarray(result.lengths, np.int64)
        longest = float(np.max(lengths))
        recent_lengths = self._lengths.setdefault(b, [])
        recent_lengths.append(lengths)
        del recent_lengths[:-_RECENT]
        per_position = getattr(result, "accepted_per_position", None)
        if gamma > 0 and per_position is not None:  # the first draft position's acceptance per call, by k (the lift)
            first = np.asarray(per_position, np.float64)[:, 0]
            calls = np.asarray(result.num_target_calls, np.float64)
            for name, rows in (("greedy", temps <= 0), ("sampled", temps > 0)):
                if rows.any() and calls[rows].sum() > 0:
                    running = self._first.setdefault((num_drafts, name), _Running(0.0, 0.0))
                    running.add(float(first[rows].sum()), float(calls[rows].sum()))
        call_alpha = float(beta.sum() / verified.sum()) if verified.sum() > 0 else float("nan")
        self.history.append((gamma, seconds, int(np.sum(result.lengths)), call_alpha))
        program = (
            gamma,
            tokens.shape,
            tuple(sorted(self.settings.items())),
            tuple(self.spec_settings.items()),
            num_drafts,
        )
        self.last_compiled, self.last_seconds = program not in self._compiled, seconds
        if self.last_compiled:  # the first call compiled: its time teaches nothing
            self._compiled.add(program)
            if num_drafts > 1 and self.branch_drafts():
                self._k_pending[b] = (gamma, num_drafts)
            elif self.num_drafts == "auto" and num_drafts > 1:
                self._k_pending[b] = num_drafts
            return
        if self.num_drafts == "auto" and gamma > 0:
            rates = self._k_rates.setdefault((b, gamma, num_drafts), [])
            rates.append(float(np.sum(result.lengths)) / max(seconds, 1e-12))
            del rates[:-_RECENT]
        costs = self.costs.get(b)
        if costs is None or gamma > costs.max_gamma or (num_drafts > 1 and num_drafts not in costs.branch):
            return  # (k drafts without measured branch costs: no model to correct)
        iterations = float(np.max(result.num_target_calls)) if gamma > 0 else longest  # the loop's, exactly
        recent = self._factors.setdefault((b, _kind(gamma, num_drafts)), [])
        recent.append(seconds / max(_model_seconds(costs, gamma, iterations, num_drafts), 1e-12))
        del recent[:-_RECENT]

"""γ auto's cost model: the rate model, the measured costs and their key on disk, and the running α — what
``specjax.Decoder`` (one batch at a time) and ``specjax.BulkDecoder`` (decode slots) both choose γ with.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``T`` max_decode_length, ``g`` gamma.

- **Rate model** (Leviathan et al. 2023, §3.1, eq. 1): ``expected_tokens`` E(α, γ) = (1 − α^(γ+1)) / (1 − α)
  tokens per iteration; ``expected_iterations`` / ``expected_iterations_table`` the expected loop iterations of a
  batch under the paper's i.i.d. acceptance model, its slowest row and each row's short last window counted;
  ``expected_tokens_multi`` with a lifted first position (multi-draft verification).
- **Costs** (seconds): ``measure_costs`` times the models' real decode functions jitted alone (encode, the
  target's step and (γ + 1)-token window, the draft's step, the k-branch windows), once per machine and shape;
  ``Costs`` holds them (``Costs.iteration(γ)``), kept on disk by ``specjax.hardware.CostCache`` under a key made
  of the models' digests (``fingerprint``).
- **α**: ``recorded_alpha`` is the shipped pairs' recorded α (the prior); ``RunningAlpha`` the running mean of
  β over verified positions with a decaying weight.

The policy that uses them — which γ (and k) to run, exploring, learning the time factor — is ``Decoder``'s
(``specjax/decoder.py``); the bulk decoder's rate per slot is ``BulkDecoder._rates``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from typing import Sequence

import jax
import numpy as np

from specjax import defaults
from specjax.decoding import xla_cpu
from specjax.decoding.baseline import STEP_WINDOW, decode_step
from specjax.decoding.loop import as_draft_source
from specjax.decoding.model import as_decoding_model

__all__ = [
    "BRANCH_WINDOWS_MEASURED",
    "Choice",
    "Costs",
    "RunningAlpha",
    "WINDOWS_MEASURED",
    "expected_iterations",
    "expected_iterations_table",
    "expected_tokens",
    "expected_tokens_multi",
    "fingerprint",
    "measure_costs",
    "recorded_alpha",
]

_DECAY = 0.9  # weight of earlier calls' evidence at each update (α, lengths)


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per iteration] = (1 − α^(γ+1)) / (1 − α) (Leviathan et al. 2023, eq. 1); γ + 1 at α = 1; 1 at γ 0."""
    if gamma == 0:
        return 1.0
    a = min(max(float(alpha), 0.0), 1.0)
    return float(gamma + 1) if a >= 1.0 else (1.0 - a ** (gamma + 1)) / (1.0 - a)


def expected_tokens_multi(alpha: float, first: float, gamma: int) -> float:
    """E[tokens per iteration] when the first draft position is accepted with chance ``first`` and each later
    one with ``alpha`` (the paper's i.i.d. model, §3.1, with the branch point apart): ``1 + first · (1 − α^γ) /
    (1 − α)``; ``expected_tokens(α, γ)`` at ``first = α``. Multi-draft verification (``num_drafts`` = k) raises
    ``first`` (recursive rejection sampling keeps one of k candidates), not α along the kept branch."""
    if gamma == 0:
        return 1.0
    a, a1 = min(max(float(alpha), 0.0), 1.0), min(max(float(first), 0.0), 1.0)
    return 1.0 + a1 * (float(gamma) if a >= 1.0 else (1.0 - a**gamma) / (1.0 - a))


def expected_iterations(lengths, alpha: float, gamma: int) -> float:
    """Expected loop iterations of a decode call whose rows are ``lengths`` tokens long (EOS included).

    γ 0 (the target alone): ``max(lengths)``, one token per iteration. γ >= 1: each iteration emits ``e`` tokens
    per row, ``P(e = j) = α^(j−1)(1 − α)`` for ``j <= γ`` and ``P(e = γ + 1) = α^γ`` (Leviathan et al. 2023,
    §3.1: α i.i.d. per position; E[e] = (1 − α^(γ+1)) / (1 − α)), until the row's ``L`` tokens are out (its last
    window is cut short); the loop runs until every row is done. With ``S_k`` the tokens after ``k`` iterations
    (``k``-fold convolution of e's distribution), a row is done after ``k`` iterations with probability
    ``F_L(k) = P(S_k >= L)``, and ``E[max over rows] = Σ_k (1 − Π_rows F_L(k))``: exact under the model, no
    sampling.

    Args:
      lengths: int[b] (or a sequence) row lengths, tokens (>= 1). alpha: in [0, 1]. gamma: >= 0.
    Returns:
      float iterations (>= 1).
    """
    return expected_iterations_table([lengths], alpha, (gamma,))[gamma]


def expected_iterations_table(calls: Sequence, alpha: float, gammas: Sequence[int], first: float | None = None) -> dict:
    """{γ: ``expected_iterations`` averaged over ``calls``} (each an int[b] of row lengths) for every γ in
    ``gammas``, in one pass: the distributions of ``S_k`` for all γ are advanced together, once for the longest
    row of all the calls (about a millisecond for 8 calls of 64 rows), so a choice costs little beside a call.

    ``first``: the chance that the first draft position is accepted (None: ``alpha``), for multi-draft
    verification, where k candidates at the branch point raise it: ``P(A >= j) = first · α^(j−1)`` for
    ``1 <= j <= γ`` (``expected_tokens_multi``)."""
    calls = [np.maximum(np.asarray(x, np.int64).reshape(-1), 1) for x in calls]
    longest = max(int(x.max()) for x in calls)
    out = {g: float(np.mean([x.max() for x in calls])) for g in gammas if g == 0}
    spec = [g for g in gammas if g > 0]
    if not spec:
        return out
    a = min(max(float(alpha), 0.0), 1.0)
    a1 = a if first is None else min(max(float(first), 0.0), 1.0)
    width = max(spec) + 2
    pmf = np.zeros((len(spec), width))  # [γ, e]: P(e) for e = 0..max γ + 1; P(A >= j) = a1 · a^(j − 1)
    for i, g in enumerate(spec):
        reach = [1.0] + [a1 * a ** (j - 1) for j in range(1, g + 1)]  # P(A >= j), j = 0..γ
        pmf[i, 1 : g + 1] = [reach[j - 1] - reach[j] for j in range(1, g + 1)]
        pmf[i, g + 1] = reach[g]
    # shift[i, t, u] = P(e = u - t) for γ spec[i]: one iteration moves the total from t to u
    t = np.arange(longest)
    shift = np.zeros((len(spec), longest, longest + width))
    for e in range(1, width):
        shift[:, t, t + e] = pmf[:, e : e + 1]
    rows = np.concatenate(calls)  # every row of every call, and the call each belongs to
    owner = np.repeat(np.arange(len(calls)), [x.size for x in calls])
    dist = np.zeros((len(spec), longest))  # P(S_k = t) for t < longest (totals that reached it are dropped)
    dist[:, 0] = 1.0
    not_done = np.zeros((len(spec), len(calls)))  # Σ_k P(some row of the call not done after k iterations)
    for _ in range(longest):
        below = np.concatenate([np.zeros((len(spec), 1)), np.cumsum(dist, -1)], -1)[:, rows]  # P(row not done)
        with np.errstate(divide="ignore"):
            log_done = np.log(np.clip(1.0 - below, 0.0, 1.0))  # [γ, rows]
        per_call = np.zeros((len(spec), len(calls)))
        np.add.at(per_call, (slice(None), owner), log_done)
        not_done += 1.0 - np.exp(per_call)
        dist = np.einsum("it,itu->iu", dist, shift)[:, :longest]
    out.update({g: float(max(np.mean(not_done[i]), 1.0)) for i, g in enumerate(spec)})
    return out


@dataclasses.dataclass(frozen=True)
class Costs:
    """Measured seconds of the parts of one decode call at one batch shape, indexed by γ (0..len - 1).

    Attributes:
      step: float seconds per γ: ``step[0]`` the target's one-token step (the baseline's iteration), ``step[g]``
        its (g + 1)-token verification window, each at batch ``b`` with the compile options of that γ's loop.
      draft: seconds of one draft step (one token, batch ``b``) in γ's loop; ``draft[0] = 0``.
      encode: seconds of the per-call encode (the target's, plus the draft's for γ >= 1).
      branch: multi-draft verification, {k: (window seconds per γ, the target's k-branch window of γ + 1 tokens
        per branch (``decode_branches``; entry 0 unused), seconds of a draft step on ``b · k`` rows)}; empty when
        not measured (``measure_costs(..., num_drafts=...)``).
    """

    step: tuple[float, ...]
    draft: tuple[float, ...]
    encode: tuple[float, ...]
    branch: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not (len(self.step) == len(self.draft) == len(self.encode)) or len(self.step) < 1:
            raise ValueError(
                f"Costs needs one entry per γ in each field, got {len(self.step)}, {len(self.draft)}, "
                f"{len(self.encode)}."
            )

    @property
    def max_gamma(self) -> int:
        """The largest γ these costs cover."""
        return len(self.step) - 1

    def iteration(self, gamma: int, num_drafts: int = 1) -> float:
        """Seconds of one loop iteration at ``gamma``: the target step (γ 0) or window + γ draft steps; with
        ``num_drafts`` = k > 1 the k-branch window, the draft's first step on ``b`` rows and γ − 1 steps on
        ``b · k`` rows (``specjax.decoding.branches``). Raises KeyError for a k not in ``branch``."""
        if num_drafts == 1 or gamma == 0:
            return self.step[gamma] + gamma * self.draft[gamma]
        window, draft_rows = self.branch[num_drafts]
        return window[gamma] + self.draft[gamma] + (gamma - 1) * draft_rows

    def to_json(self) -> dict:
        """A JSON-able dict (``from_json`` reads it back)."""
        out = {"step": list(self.step), "draft": list(self.draft), "encode": list(self.encode)}
        if self.branch:
            out["branch"] = {str(k): {"step": list(w), "draft": d} for k, (w, d) in self.branch.items()}
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Costs":
        """Reads ``to_json``'s dict. Raises ValueError/KeyError/TypeError on a malformed one."""
        branch = {
            int(k): (tuple(float(x) for x in v["step"]), float(v["draft"])) for k, v in d.get("branch", {}).items()
        }
        return cls(*(tuple(float(x) for x in d[k]) for k in ("step", "draft", "encode")), branch)


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a ``Decoder`` call ran and why (``Decoder.last_choice``).

    Attributes:
      gamma: the γ run (0: the target alone).
      predicted: {γ: predicted tokens/s} for every candidate (empty when γ was fixed or forced).
      alpha: the α the prediction used.
      reason: one line, e.g. "auto: γ 5 predicted 251 tok/s, 1.62x the target alone (α 0.77)".
      num_drafts: the k of the call (``speculative_sample(..., num_drafts=k)``; 1: one draft), chosen with γ when
        both are chosen (``gamma="auto"`` with ``num_drafts`` "auto" or a k > 1).
      predicted_drafts: {(γ, k): predicted tokens/s} for the k > 1 candidates of a joint choice (else empty).
    """

    gamma: int
    predicted: dict
    alpha: float
    reason: str
    num_drafts: int = 1
    predicted_drafts: dict = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        """The reason and the predicted tokens/s of each candidate on one line."""
        table = " ".join(f"{g}:{v:.0f}" for g, v in sorted(self.predicted.items()))
        multi = " ".join(f"{g}x{k}:{v:.0f}" for (g, k), v in sorted(self.predicted_drafts.items()))
        return (
            self.reason
            + (f"; predicted tok/s by γ {table}" if table else "")
            + (f"; by γ x num_drafts {multi}" if multi else "")
        )


def _options(rows: int, params, batch: int):
    try:
        return xla_cpu.cpu_compiler_options(rows, xla_cpu.weights_dtype(params), batch=batch)
    except TypeError:  # a signature that also wants the devices: fall back to XLA's defaults
        return None


def _least_seconds_interleaved(parts: dict, repeats: int) -> dict:
    """{name: least wall seconds of ``fn(*args)``} for ``parts`` = {name: (fn, args)}: each compiled and run once
    untimed, then timed in ``repeats`` rounds that take the parts in turn (a rotating order), keeping each part's
    least. A burst of load on a shared machine then falls on one round of every part, not on every run of one
    part, and the least of the rounds is the steadiest figure."""
    for fn, args in parts.values():
        jax.block_until_ready(fn(*args))
    names = list(parts)
    best = {name: math.inf for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn, args = parts[name]
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


WINDOWS_MEASURED = (2, 4, 6, 9)
"""Verification window sizes (tokens, γ + 1) ``measure_costs`` times; the others are interpolated linearly."""


BRANCH_WINDOWS_MEASURED = (2, 9)
"""Tokens per branch (γ + 1) of the k-branch windows ``measure_costs`` times; the others are interpolated."""


def measure_costs(
    target,
    draft,
    tokens,
    max_decode_length: int,
    max_gamma: int = 8,
    repeats: int = 5,
    num_drafts: Sequence[int] = (),
) -> Costs:
    """Times the target's step and windows, the draft's step and the encodes at this batch shape.

    Each decode part is the model's real ``DecodingModel`` function called 12 times in a jitted loop (each call
    fed the previous one's argmax, so every logit is used), as the decode loops run it: work XLA hoists out of
    a loop (a bfloat16 model's weights converted for XLA:CPU's float32 dots) is then paid once per loop, not
    per call. Compiled with the XLA:CPU options the loop of that γ uses (``decoding/xla_cpu.py``), on a cache of
    the loop's length (``T + max_gamma + 1``); the least of ``repeats`` runs after a warm-up, per call. The
    target alone's step (``baseline.decode_step``, as ``temperature_sample`` runs it) and its windows of
    ``WINDOWS_MEASURED`` tokens are timed, other windows interpolated linearly in the window size; the draft
    step once per distinct compile option set; the encodes once. The
    parts are timed in ``repeats`` interleaved rounds (``_least_seconds_interleaved``), so a burst of load on a
    shared machine cannot make one part look slow beside the others. Compile time is not measured. About 5-10
    compiles: 20-60 s for the shipped small pair on a 2-core CPU.

    Args:
      target: a ``T5Model`` or ``(DecodingModel, params)``.
      draft: the same for the draft, or a draft source without a model (``PromptLookupDraft``: its steps
        cost 0 here).
      tokens: int32[b, s] a batch of the call's shape (its real lengths set the encoder width used).
      max_decode_length: ``T`` (tokens). max_gamma: the largest γ to cover. repeats: timed rounds (each part
        once a round).
      num_drafts: k > 1 values whose multi-draft iteration to time as well (a draft model only): the target's
        k-branch window (``decode_branches``) at ``BRANCH_WINDOWS_MEASURED`` tokens per branch, interpolated
        linearly in γ, and a draft step on ``b · k`` rows (``Costs.branch``): 3 more compiles per k.
    Returns:
      ``Costs`` with ``max_gamma + 1`` entries per field (seconds).
    """
    import jax.numpy as jnp

    t_fns, t_params = as_decoding_model(target, "target")
    source, d_params = as_draft_source(draft)
    d_fns = getattr(source, "model", None)
    x = jnp.asarray(tokens, jnp.int32)
    b = x.shape[0]
    length = max_decode_length + max_gamma + 1
    calls = 12

    def decode_part(fns, params, k: int, options, rows: int = 1, branches: int = 0, step: bool = False):
        """(fn, args) running ``calls`` decode calls of ``k`` tokens in one jitted loop, on the call's rows each
        repeated ``rows`` times; with ``branches`` > 0, ``decode_branches`` calls of that many branches of ``k``
        tokens instead (the cache read, not written, as the loop's verify step); ``step``: the target alone's
        step as its loops run it (``baseline.decode_step``, k = 1)."""
        xr = jnp.repeat(x, rows, axis=0)
        br = b * rows
        enc = jax.jit(fns.encode)(params, xr)
        shape = (br, branches, k) if branches else (br, k)
        posr = jnp.ones((br,), jnp.int32)

        def chain(params, enc, cache):  # `calls` decode calls in one loop, each fed the last one's argmax
            def body(i, carry):
                cache, tokens = carry
                if step:
                    logits, cache = decode_step(fns, params, enc, tokens, cache, posr + i % 8)
                    return cache, jnp.argmax(logits, axis=-1).astype(jnp.int32)[:, None]
                if branches:
                    logits, _ = fns.decode_branches(params, enc, tokens, cache, posr + i % 8)
                else:
                    logits, cache = fns.decode(params, enc, tokens, cache, posr + i % 8)
                return cache, jnp.argmax(logits, axis=-1).astype(jnp.int32)  # every logit is used

            return jax.lax.fori_loop(0, calls, body, (cache, jnp.full(shape, 3, jnp.int32)))[1]

        return jax.jit(chain, compiler_options=options), (params, enc, fns.init_cache(br, length))

    ks = sorted({k for k in WINDOWS_MEASURED if k <= max_gamma + 1} | {max_gamma + 1} - {1})
    # The target alone's step on the windows' numeric path (STEP_WINDOW, decode_step): timed as it runs.
    parts = {("target", 1): decode_part(t_fns, t_params, 1, _options(b * STEP_WINDOW, t_params, b), step=True)}
    parts.update({("target", k): decode_part(t_fns, t_params, k, _options(b * k, t_params, b)) for k in ks})
    draft_options: dict = {}  # γ -> the key of the compile options its loop uses (the draft step runs under them)
    for g in range(1, max_gamma + 1):
        options = _options(b * (g + 1), t_params, b)
        okey = tuple(sorted((options or {}).items()))
        draft_options[g] = okey
        if d_fns is not None and ("draft", okey) not in parts:
            parts[("draft", okey)] = decode_part(d_fns, d_params, 1, options)
    parts[("encode", "target")] = (jax.jit(t_fns.encode), (t_params, x))
    if d_fns is not None:
        parts[("encode", "draft")] = (jax.jit(d_fns.encode), (d_params, x))
    branch_ks = sorted({int(k) for k in num_drafts if k > 1}) if d_fns is not None else []
    branch_ws = sorted({min(max(w, 2), max_gamma + 1) for w in BRANCH_WINDOWS_MEASURED})
    for k in branch_ks:
        for w in branch_ws:
            parts[("branch", k, w)] = decode_part(t_fns, t_params, w, _options(b * k * w, t_params, b), branches=k)
        parts[("draft rows", k)] = decode_part(d_fns, d_params, 1, None, rows=k)
    seconds = _least_seconds_interleaved(parts, repeats)

    window = {k: seconds[("target", k)] / calls for k in ks}
    for i, k in enumerate(ks):  # a wider window is never cheaper (on a shared machine noise can say otherwise)
        window[k] = max(window[j] for j in ks[: i + 1])
    step = [seconds[("target", 1)] / calls]
    for g in range(1, max_gamma + 1):
        step.append(float(np.interp(g + 1, ks, [window[k] for k in ks])))
    drafts = [0.0] + [
        seconds[("draft", draft_options[g])] / calls if d_fns is not None else 0.0 for g in range(1, max_gamma + 1)
    ]
    e_t = seconds[("encode", "target")]
    e_d = seconds.get(("encode", "draft"), 0.0)
    encodes = [e_t] + [e_t + e_d] * max_gamma
    branch = {}
    for k in branch_ks:
        windows = [seconds[("branch", k, w)] / calls for w in branch_ws]
        windows = [max(windows[: i + 1]) for i in range(len(windows))]  # a wider window is never cheaper
        per_gamma = (0.0,) + tuple(float(np.interp(g + 1, branch_ws, windows)) for g in range(1, max_gamma + 1))
        branch[k] = (per_gamma, seconds[("draft rows", k)] / calls)
    return Costs(tuple(step), tuple(drafts), tuple(encodes), branch)


def _kind(gamma: int, num_drafts: int = 1) -> str:
    """The kind of program a γ runs: "target alone" (γ 0, ``temperature_sample``), "speculative" (one draft) or
    "k drafts" (multi-draft verification, ``num_drafts`` = k > 1)."""
    if gamma == 0:
        return "target alone"
    return "speculative" if num_drafts == 1 else f"{num_drafts} drafts"


def _model_seconds(costs: Costs, gamma: int, iterations: float, num_drafts: int = 1) -> float:
    """The cost model's seconds for a call at ``gamma`` (and ``num_drafts``) of ``iterations`` loop iterations:
    encode + iterations · ``costs.iteration(gamma, num_drafts)`` (module docstring)."""
    return costs.encode[gamma] + max(iterations, 1.0) * costs.iteration(gamma, num_drafts)


def _model_digest(model) -> str:
    """A digest of what a model's costs depend on: its ``DecodingModel`` (config, kv dtype), parameter
    dtypes and shapes (not values)."""
    fns, params = as_draft_source(model)
    if params is None:
        return f"source:{fns!r}"
    leaves = jax.tree_util.tree_leaves(params)
    shapes = sorted(f"{getattr(x, 'dtype', '?')}{tuple(getattr(x, 'shape', ()))}" for x in leaves)
    return hashlib.sha256((repr(fns) + "|".join(shapes)).encode()).hexdigest()[:16]


def fingerprint(model) -> str | None:
    """A 16-hex-digit digest of a model's weights that is cheap and dtype-independent: every parameter's path and
    shape and its first 8 values as float32 (exact for bfloat16 files loaded in either dtype). None for a draft
    source without weights."""
    params = getattr(model, "params", None)
    if params is None and isinstance(model, tuple) and len(model) == 2:
        params = model[1]
    if params is None:
        return None
    h = hashlib.sha256()
    for path, x in sorted(jax.tree_util.tree_leaves_with_path(params), key=lambda kv: jax.tree_util.keystr(kv[0])):
        if isinstance(x, jax.core.Tracer):
            return None
        h.update(jax.tree_util.keystr(path).encode())
        h.update(str(tuple(x.shape)).encode())
        h.update(np.asarray(np.asarray(x).reshape(-1)[:8], np.float32).tobytes())
    return h.hexdigest()[:16]


# (target fingerprint, draft fingerprint) of the shipped pairs -> (size, draft name) in specjax.defaults.PAIR_ALPHA.
_SHIPPED = {
    ("60227d938666886f", "98f55142e9b66f70"): ("mini", "distilled"),
    ("60227d938666886f", "10a44766e3a13d4a"): ("mini", "reference"),
    ("391c05fcc4da2c71", "afef4ffa901bd564"): ("small", "distilled"),
    ("391c05fcc4da2c71", "8e7ab96a006763bf"): ("small", "reference"),
}


def recorded_alpha(target, draft) -> tuple[float, float] | None:
    """The shipped pair's recorded (temperature 0, temperature 1) α (``specjax.defaults.PAIR_ALPHA``) when
    ``target`` and ``draft`` are a shipped pair's weights (``fingerprint``), else None."""
    name = _SHIPPED.get((fingerprint(target), fingerprint(draft)))
    return getattr(defaults, "PAIR_ALPHA", {}).get(name) if name else None


class _Running:
    """A decayed running ratio ``num / den`` starting from ``prior`` with weight ``weight``."""

    def __init__(self, prior: float, weight: float):
        self.num, self.den = prior * weight, weight

    def add(self, num: float, den: float) -> None:
        self.num, self.den = self.num * _DECAY + num, self.den * _DECAY + den

    @property
    def value(self) -> float:
        return self.num / self.den


RunningAlpha = _Running

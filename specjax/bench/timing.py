"""Side-by-side timing: speculative_sample against temperature_sample on the same inputs, and the cost ratio c.

Only compiled programs are timed (each method's first call, which compiles, is timed apart); the two methods
alternate batch by batch on the same inputs in one process, so a slower or busier machine moves both alike
and only their ratio is reported as a result. Nothing here asserts a time.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.bulk import BulkDecoder
from specjax.decoder import Decoder
from specjax.decoding import speculative_sample, temperature_sample
from specjax.decoding.xla_cpu import TunedJit
from specjax.models import t5
from specjax.quantize import QuantizedT5Model
from specjax.sampling import argmax

__all__ = [
    "environment",
    "finish",
    "PairMeasurement",
    "BulkPairMeasurement",
    "measure_pair",
    "measure_bulk_pair",
    "measure_cost_ratio",
    "measure_costs",
]


def environment() -> dict:
    """jax version, backend, device kind and count: recorded with every result."""
    devices = jax.devices()
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
    }


def finish(result):
    """Waits until every array field of a ``DecodeResult`` is computed (the decode functions may return
    before the device has finished); returns ``result``. Works for NumPy fields too."""
    fields = (
        (getattr(result, f.name) for f in dataclasses.fields(result))
        if dataclasses.is_dataclass(result)
        else jax.tree_util.tree_leaves(result)
    )
    for v in fields:
        if hasattr(v, "block_until_ready"):
            v.block_until_ready()
    return result


def _field(results, name: str, n: int) -> np.ndarray | None:
    """Concatenation of one field over per-batch results, the first ``n`` rows; None where it is missing."""
    if not results or getattr(results[0], name, None) is None:
        return None
    return np.concatenate([np.asarray(getattr(r, name)) for r in results])[:n]


@dataclasses.dataclass
class PairMeasurement:
    """Speculative sampling and temperature_sample on the same inputs, timed alternately after compilation.

    Attributes:
      spec_seconds, base_seconds: total wall time (seconds) over all batches and repeats (compiled calls).
      spec_compile_seconds, base_compile_seconds: the first call of each (compile + run), seconds; with a
        ``Decoder`` (γ auto or 0) the speculative side's is the sum of its calls that compiled a program (each γ
        it picked for the first time).
      calibration_seconds: with γ auto, the ``Decoder``'s cost measurement (``Decoder.costs_for``; near 0 when
        the costs were cached on disk by an earlier run); else 0.
      warmup_seconds: with γ auto, the rest of the untimed first pass over every batch (the calls that did not
        compile: they teach the Decoder α and row lengths); else 0.
      first_pass_gamma: with γ auto, the γ of that first pass: ``first_pass_gamma`` when the costs were not known
        yet, else "auto" (the Decoder's own choices); else None.
      spec, base: ``DecodeResult`` per batch (from the last repeat).
      num_inputs: real rows (filler rows of the last batch excluded).
      gammas: with ``gamma="auto"``: the γ each batch of the last pass ran (0: the target alone); else None.
      decoder: with ``gamma="auto"`` or 0: the ``specjax.Decoder`` that ran the speculative side.
    """

    spec_seconds: float
    base_seconds: float
    spec_compile_seconds: float
    base_compile_seconds: float
    spec: list
    base: list
    num_inputs: int
    gammas: list | None = None
    decoder: object = None
    calibration_seconds: float = 0.0
    warmup_seconds: float = 0.0
    first_pass_gamma: int | str | None = None

    def _rows(self, results, field):
        return _field(results, field, self.num_inputs)

    @property
    def speedup(self) -> float:
        """base_seconds / spec_seconds."""
        return self.base_seconds / self.spec_seconds

    @property
    def acceptance_rate(self) -> float | None:
        """The paper's α over all real rows (Leviathan et al. 2023, §3.1): Σ beta_sum / Σ num_verified, from the
        β accumulated inside the loop; None when the results do not carry ``beta_sum``."""
        beta, verified = self._rows(self.spec, "beta_sum"), self._rows(self.spec, "num_verified")
        if beta is None or verified is None:
            return None
        return float(beta.astype(np.float64).sum() / max(1, int(verified.sum())))

    @property
    def row_acceptance_rates(self) -> np.ndarray | None:
        """float[num_inputs]: the paper's α per row (NaN where nothing was verified); None without ``beta_sum``."""
        beta, verified = self._rows(self.spec, "beta_sum"), self._rows(self.spec, "num_verified")
        if beta is None or verified is None:
            return None
        with np.errstate(invalid="ignore", divide="ignore"):
            return beta.astype(np.float64) / verified

    @property
    def accepted_fraction(self) -> float:
        """Accepted / drafted tokens over all real rows (not the paper's α: smaller for γ > 1, since drafts
        after the first rejection of an iteration are drafted but never tested)."""
        return float(
            self._rows(self.spec, "num_accepted").sum() / max(1, self._rows(self.spec, "num_draft_tokens").sum())
        )

    @property
    def row_accepted_fractions(self) -> np.ndarray:
        """float[num_inputs]: accepted / drafted per row (NaN where nothing was drafted)."""
        drafted = self._rows(self.spec, "num_draft_tokens").astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return self._rows(self.spec, "num_accepted") / drafted

    @property
    def accepted_per_position(self) -> list[int] | None:
        """int per draft position i (γ of them): how often position i was accepted, summed over real rows
        (vLLM's ``num_accepted_tokens_per_pos``); None when the results do not carry it."""
        counts = self._rows(self.spec, "accepted_per_position")
        return None if counts is None else [int(c) for c in counts.sum(axis=0)]

    @property
    def mean_accepted_length(self) -> float:
        """Accepted draft tokens per iteration (per target call), over all real rows."""
        return float(
            self._rows(self.spec, "num_accepted").sum() / max(1, self._rows(self.spec, "num_target_calls").sum())
        )

    @property
    def tokens_per_target_call(self) -> float:
        """Emitted tokens / target calls of the speculative runs."""
        return float(self._rows(self.spec, "lengths").sum() / max(1, self._rows(self.spec, "num_target_calls").sum()))

    @property
    def output_tokens(self) -> int:
        """Tokens emitted by the speculative runs (real rows, one repeat)."""
        return int(self._rows(self.spec, "lengths").sum())

    @property
    def base_output_tokens(self) -> int:
        """Tokens emitted by the temperature_sample runs (real rows, one repeat); differs from
        ``output_tokens`` when sampling (temperature > 0)."""
        return int(self._rows(self.base, "lengths").sum())

    @property
    def spec_iterations(self) -> int:
        """Loop iterations of the speculative runs (one repeat): per batch the most target calls of a row."""
        return int(sum(int(np.max(np.asarray(r.num_target_calls))) for r in self.spec))

    def sequences(self, which: str = "spec") -> list[np.ndarray]:
        """Output token rows (real rows only), each trimmed to its length."""
        results = self.spec if which == "spec" else self.base
        seqs = self._rows(results, "sequences")
        lens = self._rows(results, "lengths")
        return [s[:n] for s, n in zip(seqs, lens)]


def measure_pair(
    target,
    draft,
    batches: Sequence[np.ndarray],
    *,
    gamma: int | str,
    temperature: float,
    max_decode_length: int,
    num_inputs: int | None = None,
    seed: int = 0,
    repeats: int = 1,
    top_k: int = 0,
    top_p: float = 1.0,
    max_input_length: int = 512,
    truncate: bool = False,
    verification: str = "token",
    draft_confidence_threshold: float | None = None,
    on_batch: Callable[[], None] | None = None,
    on_output: Callable[[int, object], None] | None = None,
    first_pass_gamma: int | None = None,
) -> PairMeasurement:
    """Runs speculative_sample and temperature_sample on the same batches, alternating, after compiling each.

    Args:
      target: a ``T5Model``. draft: a ``T5Model``, or a draft source (``specjax.PromptLookupDraft``).
      batches: int32[b, s] arrays sharing one shape (see ``pad_batches``).
      gamma: draft tokens per target call, or "auto" / 0: a ``specjax.Decoder`` runs the speculative side
        (auto: a first untimed pass over every batch compiles the programs it picks and teaches it α).
      num_inputs: real rows in total (trailing filler rows of the last batch are excluded from counts).
      seed: batch ``j`` uses ``PRNGKey(seed + j)`` for both methods.
      repeats: passes over all batches; times are summed, results kept from the last pass.
      max_input_length, truncate: passed to both decode functions (longer inputs are cut when truncate).
      verification, draft_confidence_threshold: passed to ``speculative_sample`` only ("token" / "block";
        None or a probability in [0, 1], draft models only).
      on_batch: called after each batch of the timed passes (progress bars).
      on_output: called once per batch with (batch index, its first speculative ``DecodeResult``, on the host) as
        soon as that result exists: during the untimed first pass with γ auto, so the first outputs can be shown
        before the timed passes (the demo prints each translation as it comes).
      first_pass_gamma: with γ auto, run the untimed first pass at this fixed γ (forced through the Decoder, which
        learns α from it) before measuring the costs, so the first outputs come after one compile instead of after
        the cost measurement and its compiles; skipped when the costs are known already (on disk from an earlier
        run: the Decoder then chooses at once). None: the first pass is the Decoder's own choices, after measuring.
    Returns:
      ``PairMeasurement`` (seconds include waiting for the device to finish each call).
    Raises:
      ValueError: from the decode functions' validation (gamma, temperature, …) before compiling.
    """
    kw = dict(
        max_decode_length=max_decode_length,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        max_input_length=max_input_length,
        truncate=truncate,
    )

    spec_kw = dict(kw, verification=verification)
    if draft_confidence_threshold is not None:  # the keyword stays unset for draft sources without confidence
        spec_kw["draft_confidence_threshold"] = draft_confidence_threshold

    decoder, gammas, compiled = None, None, []
    shown: set = set()

    def show(j, r):
        if on_output is not None and j not in shown:
            shown.add(j)
            on_output(j, jax.device_get(r))

    calibration = warmup = 0.0
    t0 = time.perf_counter()
    if gamma == "auto" or gamma == 0:
        static = {k: v for k, v in spec_kw.items() if k not in ("temperature", "top_k", "top_p")}
        decoder = Decoder(target, draft, gamma=gamma, **static)
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)

        def spec(j, x):
            r = finish(decoder(x, rng=jax.random.PRNGKey(seed + j), **sampling))
            if decoder.last_compiled:  # a γ first picked now: its compiling call is run again, not charged
                compiled.append(decoder.last_seconds)
                r = finish(decoder(x, rng=jax.random.PRNGKey(seed + j), gamma=decoder.last_choice.gamma, **sampling))
            gammas.append(decoder.last_choice.gamma)
            return r

        def first(j, x):  # the first pass at a fixed γ: outputs before the cost measurement
            r = finish(decoder(x, rng=jax.random.PRNGKey(seed + j), gamma=first_pass_gamma, **sampling))
            if decoder.last_compiled:
                compiled.append(decoder.last_seconds)
            return r

        gammas = []
        # With the costs on disk already (a second run) γ auto chooses at once: its first pass runs its own choice,
        # so no program is traced and loaded for the fixed γ alone.
        early = gamma == "auto" and first_pass_gamma is not None and not decoder.costs_known(batches[0])
        if gamma == "auto" and not early:  # the cost measurement, apart (cached on disk: near 0 on a second run)
            decoder.costs_for(batches[0])
            calibration = time.perf_counter() - t0
        t0 = time.perf_counter()
        for j, x in enumerate(batches if gamma == "auto" else batches[:1]):  # compiles; teaches α, not time
            show(j, (first if early else spec)(j, x))
        spec_compile = sum(compiled)
        warmup = time.perf_counter() - t0 - spec_compile
        compiled.clear()
        if early:
            t0 = time.perf_counter()
            decoder.costs_for(batches[0])
            calibration = time.perf_counter() - t0
            gammas.clear()
        first_gamma = first_pass_gamma if early else ("auto" if gamma == "auto" else None)
    else:
        first_gamma = None

        def spec(j, x):
            return finish(
                speculative_sample(target, draft, x, rng=jax.random.PRNGKey(seed + j), gamma=gamma, **spec_kw)
            )

        show(0, spec(0, batches[0]))
        spec_compile = time.perf_counter() - t0

    def base(j, x):
        return finish(temperature_sample(target, x, rng=jax.random.PRNGKey(seed + j), **kw))

    t0 = time.perf_counter()
    base(0, batches[0])
    base_compile = time.perf_counter() - t0
    spec_s = base_s = 0.0
    compiled.clear()  # from here on, a compiling call's seconds are taken off the speculative time
    for _ in range(repeats):
        spec_results, base_results = [], []
        if gammas is not None:
            gammas.clear()
        for j, x in enumerate(batches):
            order = (spec, base) if j % 2 == 0 else (base, spec)  # alternate who goes first
            for fn in order:
                t0 = time.perf_counter()
                r = fn(j, x)
                dt = time.perf_counter() - t0
                if fn is spec:
                    spec_s += dt
                    spec_results.append(r)
                    show(j, r)
                else:
                    base_s += dt
                    base_results.append(r)
            if on_batch:
                on_batch()
    spec_s -= sum(compiled)
    n = num_inputs if num_inputs is not None else sum(b.shape[0] for b in batches)
    return PairMeasurement(
        spec_s,
        base_s,
        spec_compile,
        base_compile,
        spec_results,
        base_results,
        n,
        gammas,
        decoder,
        calibration,
        warmup,
        first_gamma,
    )


@dataclasses.dataclass(frozen=True)
class BulkRows:
    """Lines of a bulk decode (``specjax.bulk.LineResult``, in input order) as one batch of ``DecodeResult``-like
    fields, so ``PairMeasurement``'s properties read them as they read a batch.

    Attributes:
      sequences: int32[n, T] output tokens, each line padded with 0 after its length. lengths: int32[n].
      num_target_calls, num_draft_tokens, num_accepted, num_verified: int32[n]. beta_sum: float32[n].
    """

    sequences: np.ndarray
    lengths: np.ndarray
    num_target_calls: np.ndarray
    num_draft_tokens: np.ndarray
    num_accepted: np.ndarray
    beta_sum: np.ndarray
    num_verified: np.ndarray

    @classmethod
    def of(cls, lines: Sequence, max_decode_length: int) -> "BulkRows":
        """From ``LineResult`` s (``max_decode_length``: the width of ``sequences``)."""
        seqs = np.zeros((len(lines), max_decode_length), np.int32)
        for j, r in enumerate(lines):
            seqs[j, : len(r.tokens)] = r.tokens

        def col(name, dtype=np.int32):
            return np.array([getattr(r, name) for r in lines], dtype)

        return cls(
            seqs,
            np.array([len(r.tokens) for r in lines], np.int32),
            col("num_target_calls"),
            col("num_draft_tokens"),
            col("num_accepted"),
            col("beta_sum", np.float32),
            col("num_verified"),
        )


@dataclasses.dataclass
class BulkPairMeasurement(PairMeasurement):
    """``PairMeasurement`` of two bulk decodes (``measure_bulk_pair``): ``spec`` and ``base`` each hold one
    ``BulkRows`` (every line, input order); ``gammas`` is the γ of each run of the slot loop (γ auto).

    Attributes (beyond ``PairMeasurement``'s):
      loop_iterations: iterations of the speculative side's slot loop (one pass): each is one target call of
        every busy slot. base_loop_iterations: the same for the target alone.
    """

    loop_iterations: int = 0
    base_loop_iterations: int = 0

    @property
    def spec_iterations(self) -> int:
        """Slot-loop iterations of the speculative side (one pass)."""
        return self.loop_iterations


def measure_bulk_pair(
    target,
    draft,
    inputs: Sequence[Sequence[int]],
    *,
    gamma: int | str,
    batch_size: int,
    temperature: float,
    max_decode_length: int,
    seed: int = 0,
    repeats: int = 1,
    top_k: int = 0,
    top_p: float = 1.0,
    max_input_length: int = 512,
    truncate: bool = False,
    verification: str = "token",
    draft_confidence_threshold: float | None = None,
    on_batch: Callable[[], None] | None = None,
) -> BulkPairMeasurement:
    """Bulk decoding (``specjax.bulk.BulkDecoder``: ``batch_size`` slots refilled as lines finish, inputs sorted by
    length) at ``gamma`` against the target alone through the same slots, on the same inputs, whole passes
    alternating: the path ``specjax generate`` runs, so a batch size > 1 in ``specjax bench`` measures what a file
    or a test set gets.

    Each side first makes one untimed pass over every input (it compiles the slot programs every group size and
    encoder width needs, and teaches γ auto α); then ``repeats`` timed passes, alternating which side goes first.

    Args:
      target, draft: as ``BulkDecoder`` (a draft model or source; γ 0 needs none).
      inputs: token id rows (EOS-terminated, as the tokenizer makes them), any lengths.
      gamma: an int >= 1, 0 or "auto" (``BulkDecoder``'s). batch_size: slots.
      temperature, top_k, top_p, max_decode_length, max_input_length, truncate, verification,
        draft_confidence_threshold: as ``BulkDecoder`` / ``BulkDecoder.generate`` (both sides, but verification
        and the threshold only matter to the speculative one).
      seed: line ``i`` samples with ``fold_in(PRNGKey(seed), i)`` on both sides.
      repeats: timed passes over all inputs; seconds are summed, results kept from the last pass.
      on_batch: called once per ``batch_size`` lines of each timed speculative pass (progress bars count
        ``ceil(n / batch_size)`` per pass).
    Returns:
      ``BulkPairMeasurement`` (``spec_compile_seconds`` / ``base_compile_seconds``: the untimed first pass of each,
      compiles and run together, seconds).
    Raises:
      ValueError: as ``BulkDecoder`` and ``BulkDecoder.generate`` (γ, batch size, an empty or too long input).
    """
    common = dict(
        batch_size=batch_size,
        max_decode_length=max_decode_length,
        max_input_length=max_input_length,
        truncate=truncate,
    )
    spec_dec = BulkDecoder(
        target,
        draft,
        gamma=gamma,
        verification=verification,
        draft_confidence_threshold=draft_confidence_threshold,
        **common,
    )
    base_dec = BulkDecoder(target, None, gamma=0, **common)
    sampling = dict(rng=seed, temperature=temperature, top_k=top_k, top_p=top_p)
    rows = [np.asarray(x) for x in inputs]

    def one_pass(decoder, count: bool):
        out = []
        t0 = time.perf_counter()
        for r in decoder.generate(rows, **sampling):
            out.append(r)
            if count and on_batch is not None and (len(out) % batch_size == 0 or len(out) == len(rows)):
                on_batch()
        return time.perf_counter() - t0, out, decoder.stats

    spec_compile, _, _ = one_pass(spec_dec, False)
    base_compile, _, _ = one_pass(base_dec, False)
    spec_s = base_s = 0.0
    spec_out = base_out = []
    spec_stats = base_stats = None
    for rep in range(repeats):
        for which in ("spec", "base") if rep % 2 == 0 else ("base", "spec"):
            if which == "spec":
                dt, spec_out, spec_stats = one_pass(spec_dec, True)
                spec_s += dt
            else:
                dt, base_out, base_stats = one_pass(base_dec, False)
                base_s += dt
    gammas = [g for g, runs in sorted(spec_stats.gammas.items()) for _ in range(runs)] if gamma == "auto" else None
    return BulkPairMeasurement(
        spec_s,
        base_s,
        spec_compile,
        base_compile,
        [BulkRows.of(spec_out, max_decode_length)],
        [BulkRows.of(base_out, max_decode_length)],
        len(rows),
        gammas,
        spec_dec.decoder,
        loop_iterations=spec_stats.iterations,
        base_loop_iterations=base_stats.iterations,
    )


# ----------------------------------------------------------------------------------------------------------
# The cost ratio c: one decode call of each model, timed in a jitted loop as the decode loop runs it


def _steps_loop(config, params, encoded, cache, k: int, n: int, b: int):
    """n decode calls of a k-token window over b rows in one jitted loop (what the decode loop runs), compiled
    with the decode loops' own CPU options for b × k rows of the model's dtype (``decoding/xla_cpu.py``), so
    c and window/step are those of the loops' kernels.

    Each call's input is the argmax of the previous call's logits, as in the decode loops: every logit is
    used (a loop that kept one logit let XLA slice the logits dot down to one column, which made windows and
    draft steps look cheaper than the loops' own) and the calls form a serial chain.
    """

    def body(i, carry):
        cache, tokens = carry
        logits, cache = t5.decode(config, params, encoded, tokens, cache, jnp.full((b,), i % 8, jnp.int32))
        return cache, argmax(logits)  # [b, k]: the next call's input depends on every logit

    return jax.lax.fori_loop(0, n, body, (cache, jnp.full((b, k), 3, jnp.int32)))[1]


_steps = TunedJit(_steps_loop, (0, 4, 5, 6), lambda *a: a[6] * a[4], lambda *a: a[1], lambda *a: a[6])


def _time_steps(model, encoder_input_tokens, k: int, n: int, repeats: int) -> float:
    if isinstance(model, QuantizedT5Model):  # unscanned (CPU), the loops dequantize once per call, outside their
        model = model.dequantized()  # while loop (XLA hoists it): the steps they run are the dequantized model's
    encoded = model.encode(encoder_input_tokens)
    cache = model.init_cache(encoder_input_tokens.shape[0], 16 + k)
    b = int(encoder_input_tokens.shape[0])
    jax.block_until_ready(_steps(model.config, model.params, encoded, cache, k, n, b))  # compile
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(_steps(model.config, model.params, encoded, cache, k, n, b))
        best = min(best, time.perf_counter() - t0)
    return best / n


def measure_cost_ratio(target, draft, encoder_input_tokens, gamma: int, steps: int = 64, repeats: int = 5) -> dict:
    """Measures one decode call of each model inside a jitted loop (seconds per call, best of ``repeats``).

    Args:
      encoder_input_tokens: int32[b, s] (the batch size matters: c depends on it).
    Returns:
      dict with ``draft_step_s`` (k=1), ``target_step_s`` (k=1), ``target_window_s`` (k=γ+1),
      ``c`` = draft_step_s / target_step_s (the paper's cost ratio, which assumes a window costs as much as
      one step), and ``window_over_step`` = target_window_s / target_step_s (how far that assumption holds).
    """
    costs = measure_costs(target, draft, encoder_input_tokens, [gamma], steps, repeats)
    return {
        "draft_step_s": costs["draft_step_s"],
        "target_step_s": costs["target_step_s"],
        "target_window_s": costs["target_window_s"][gamma],
        "c": costs["c"],
        "window_over_step": costs["window_over_step"][gamma],
    }


def measure_costs(
    target, draft, encoder_input_tokens, gammas: Sequence[int], steps: int = 32, repeats: int = 3
) -> dict:
    """``measure_cost_ratio`` for several γ at once (the k=1 steps are timed once, the windows per γ).

    Args:
      draft: a ``T5Model``, or None when there is no draft model (prompt lookup): then ``draft_step_s`` is
        None and ``c`` is 0 (the paper's negligible-draft limit; the lookup's own cost shows only in the
        measured speedup).
      encoder_input_tokens: int32[b, s].
      gammas: the γ values whose target windows (k = γ+1) to time.
    Returns:
      dict with ``draft_step_s``, ``target_step_s``, ``c`` (seconds per call; c = draft/target) and
      ``target_window_s`` / ``window_over_step``: dicts γ -> seconds / ratio.
    """
    tokens = np.asarray(encoder_input_tokens, np.int32)
    d = None if draft is None else _time_steps(draft, tokens, 1, steps, repeats)
    t1 = _time_steps(target, tokens, 1, steps, repeats)
    windows = {int(g): _time_steps(target, tokens, int(g) + 1, steps, repeats) for g in sorted(set(gammas))}
    return {
        "draft_step_s": d,
        "target_step_s": t1,
        "c": 0.0 if d is None else d / t1,
        "target_window_s": windows,
        "window_over_step": {g: w / t1 for g, w in windows.items()},
    }

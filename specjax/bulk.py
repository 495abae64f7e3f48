"""Bulk decoding: many inputs through a fixed set of decode slots, results in input order as they complete.

Legend for shapes (STYLE.md): ``b`` slots (the batch size), ``m`` rows inserted at once, ``S`` encoder width,
``T`` max_decode_length, ``g`` gamma.

``BulkDecoder(target, draft, batch_size=32, max_decode_length=128).generate(inputs, temperature=0.0)`` reads an
iterable of token rows and yields one ``LineResult`` per input, in input order. It reads as

    read a window → sort it by length → fill free slots → run → collect finished rows → refill → emit in order

- **Length buckets** (CTranslate2's ``rebatch_input``: it reads 16 × the batch size examples and sorts them by
  length): inputs are read ``read_ahead × b`` at a time and enter the slots longest first, so the rows inserted
  together have alike lengths and the encoder runs at one of the compiled widths just above them
  (``specjax.models.adapter.ENCODE_WIDTHS``, picked at run time inside the insert program).
- **Slots** (JetStream's / MaxText offline's shape: a host loop around a compiled multi-step decode and a
  compiled insert with donated buffers; CTranslate2 drops finished rows every step): ``b`` slots run the
  speculative loop (or the target alone, γ 0) until at least ``refill`` of them are done, then the finished
  rows leave and the next inputs are encoded into their slots (``specjax.decoding.slots``). No row waits for
  the longest row of a batch, and no finished row rides along for more than one run.
- **Exact whatever the company** (DESIGN.md, "Bulk decoding and company"): line ``i`` samples with
  ``fold_in(key, i)`` (``key`` from ``rng``), never with its slot's index, and every per-row quantity lives in
  its slot, so a line's output does not depend on the batch size, the read-ahead window or its neighbours: at
  temperature 0 it is the target's greedy decode of the line alone, and sampled with a fixed γ it is the
  output ``speculative_sample`` gives the line alone with key ``fold_in(key, i)`` (``tests/test_bulk.py``).
- **γ auto** (``specjax.gamma_auto``'s cost model at the slot count): γ in 0..8 is chosen before the first run,
  then every ``RECHOOSE_EVERY`` speculative runs from the running α; once the target alone (0) runs, the run
  stays with it (the draft's caches fall behind). A γ's rate is ``E(α, γ) / iteration(γ)`` tokens per second per
  slot (Leviathan et al. 2023, eq. 1) plus the per-line encode. Sampled draws depend on the γ chosen (the
  distribution never does): pass an int γ for reproducible sampled output.
- **Constant memory**: the window, the slots and the results waiting for an earlier line (at most about a
  window) are all that is held, whatever the length of the input.
- **Beyond one device** (``mesh=``): the slots are split over a ``("data", "model")`` mesh's "data" axis and the
  target over "model", with ``specjax.parallel``'s rules and shardings (``SlotPrograms``); the slot state stays
  on the devices between runs, and only the done flags and the finished rows come back. A row's output is the
  same as on one device (``tests/test_bulk_mesh.py``, 8 host devices).
- **Several processes** (a multi-host slice, ``jax.process_count() > 1``): each process decodes its share on its
  own devices and the results are merged in input order (``specjax.processes``); every process yields every
  line (the CLI writes on process 0) and must read the same inputs.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import warnings
from typing import Iterable, Iterator, Sequence

import jax
import numpy as np

from specjax import parallel
from specjax.decoder import CANDIDATES, SWITCH_MARGIN, Decoder, expected_tokens
from specjax.decoding import stored
from specjax.decoding.inputs import bucket_length, check_int, raw_keys
from specjax.decoding.loop import as_draft_source, speculative_sample
from specjax.decoding.model import as_decoding_model
from specjax.decoding.result import LineResult
from specjax.decoding.slots import SlotPrograms, check_slot_mesh
from specjax.decoding.stored import StoredJit
from specjax.processes import _processes, merge_processes, process_share
from specjax.sampling import SamplingParams, validate_sampling

__all__ = [
    "BulkDecoder",
    "BulkStats",
    "LineResult",
    "generate_iterable",
    "merge_processes",
    "process_share",
    "RECHOOSE_EVERY",
]

RECHOOSE_EVERY = 8
"""γ auto re-chooses γ (among 0..8, by the running α) every this many runs of the slot loop."""


@dataclasses.dataclass
class BulkStats:
    """What a ``generate`` call has done so far (updated as it runs).

    Attributes:
      lines: lines emitted. tokens: their output tokens. seconds: wall seconds since the call started (compiles
      included). first_line_seconds: wall seconds to the first emitted line (None before). runs, iterations:
      slot-loop runs and their loop iterations. beta_sum, verified: the α sums of the emitted lines. gammas:
      {γ: runs}. reasons: the γ choices made, one line each.
    """

    lines: int = 0
    tokens: int = 0
    seconds: float = 0.0
    first_line_seconds: float | None = None
    runs: int = 0
    iterations: int = 0
    beta_sum: float = 0.0
    verified: int = 0
    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    gammas: dict = dataclasses.field(default_factory=dict)
    reasons: list = dataclasses.field(default_factory=list)
    programs_built: int = 0
    programs_loaded: int = 0
    program_seconds: float = 0.0
    gamma_seconds: float = 0.0
    first_step_seconds: float | None = None

    @property
    def decode_seconds(self) -> float:
        """Wall seconds of the call less its program builds and loads (``program_seconds``) and γ auto's cost
        measurement (``gamma_seconds``): the decode alone, comparable between a first and a later call."""
        return max(self.seconds - self.program_seconds - self.gamma_seconds, 0.0)

    @property
    def alpha(self) -> float:
        """The paper's α over the emitted lines (NaN when nothing was verified)."""
        return self.beta_sum / self.verified if self.verified else float("nan")

    @property
    def tokens_per_second(self) -> float:
        """Output tokens per wall second (compiles included)."""
        return self.tokens / self.seconds if self.seconds else float("nan")


@dataclasses.dataclass
class _Run:
    """The host side of one ``BulkDecoder._decode`` call (the device side is ``slots``).

    Attributes:
      pairs: the (index, row) input stream. key: the call's PRNG key (line ``i`` uses ``fold_in(key, i)``).
      slot_line: the input index in each slot, -1 when empty (a host mirror). greedy: 1.0 at temperature 0, else
      0.0. sampling: (temperature, top_k, top_p). pending: the current window's (index, row), longest last.
      exhausted: the input is read (or refused). refused: a refused input's ValueError, raised at the end.
      slots: the ``Slots`` (None before the first insert). width: their encoder width ``S``. order: indices in
      read order (the emit order). finished: index -> ``LineResult`` waiting for an earlier line. gamma: the γ
      of the next run.
    """

    pairs: Iterator
    key: object
    slot_line: list
    greedy: float
    sampling: tuple
    pending: list = dataclasses.field(default_factory=list)
    exhausted: bool = False
    refused: Exception | None = None
    slots: object = None
    width: int = 0
    order: collections.deque = dataclasses.field(default_factory=collections.deque)
    finished: dict = dataclasses.field(default_factory=dict)
    gamma: int | None = None


def _bucket(n: int, cap: int) -> int:
    """The slot width for inputs of ``n`` tokens: the smallest power of two >= n (at least 16, so 16..256 are
    ``ENCODE_WIDTHS``), capped at ``max(cap, n)``."""
    return bucket_length(n, cap, minimum=16)


def _fold_lines(key, lines):
    """uint32[m, 2]: ``fold_in(key, line)`` for every line index int32[m]."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(lines)


_line_keys = StoredJit(_fold_lines, name="line_keys")


def _bar_status(bar, text: str | None) -> None:
    """Shows ``text`` as the progress bar's description (None: back to its own)."""
    if not hasattr(bar, "_own_desc"):
        bar._own_desc = bar.desc
    bar.set_description_str(bar._own_desc if text is None else f"{bar._own_desc}: {text}", refresh=True)


def _group_size(rows: int, refill: int, b: int, multiple: int | None) -> int:
    """The rows of one insert program for ``rows`` rows. One device (``multiple`` None): ``b``, one program per
    encoder width (it encodes only the rows in use, ``SlotPrograms.insert``'s ``count``). On a mesh, where the new
    rows are encoded together split over "data": ``refill`` × the smallest power of two that holds them, rounded
    up to a multiple of ``multiple`` (the data size), at most ``b``: a few programs serve every group."""
    if multiple is None:
        return b
    m = refill
    while m < rows:
        m *= 2
    m = -(-m // multiple) * multiple
    return min(m, b)


class BulkDecoder:
    """Decodes an iterable of inputs through ``batch_size`` decode slots (this module's docstring).

    Args:
      target: a ``T5Model`` or ``(DecodingModel, params)``.
      draft: a draft model with the target's vocabulary, a draft source (``PromptLookupDraft``), or None (the
        target alone; gamma 0 or "auto").
      batch_size: ``b``, decode slots (rows per loop iteration).
      gamma: "auto" (see the module docstring), 0 (the target alone) or an int >= 1.
      max_decode_length: ``T``, the most output tokens per line.
      eos_id, max_input_length, truncate, verification, draft_confidence_threshold: as ``speculative_sample``.
      read_ahead: inputs read and sorted at a time, in units of ``batch_size`` (CTranslate2's default is 16).
      refill: run the loop until at least this many slots are free, then refill them (default ``b // 4``, at
        least 1); one insert program per encoder width (on a mesh, groups of ``refill`` × a power of two rows).
      candidates, alpha_prior, cost_cache, costs: as ``specjax.Decoder`` (γ auto).
      mesh: None (one device) or a ``("data", "model")`` mesh of this process's devices
        (``specjax.parallel.make_mesh``): the slots split over "data" (``batch_size`` rounded up to a multiple
        of its size, with a ``UserWarning``), the target's weights over "model" by
        ``rules`` (default ``parallel.STANDARD_RULES``), the draft's replicated; the parameters are placed once.
    Raises:
      ValueError: a gamma that is not "auto" or an int >= 0, or >= 1 without a draft; batch_size, read_ahead or
        refill < 1; and every argument ``speculative_sample`` refuses (vocabularies, pad ids, eos_id); with a
        mesh: gamma "auto" (its costs are measured on one device), a mesh with other processes' devices, and the
        rules errors of ``parallel.param_shardings``.
    """

    def __init__(
        self,
        target,
        draft,
        *,
        batch_size: int = 32,
        gamma: int | str = "auto",
        max_decode_length: int,
        eos_id: int = 1,
        max_input_length: int = 512,
        truncate: bool = False,
        verification: str = "token",
        draft_confidence_threshold: float | None = None,
        read_ahead: int = 16,
        refill: int | None = None,
        candidates: Sequence[int] | None = None,
        alpha_prior=None,
        cost_cache=None,
        costs: dict | None = None,
        mesh=None,
        rules=None,
    ):
        if not (gamma == "auto" or (isinstance(gamma, int) and not isinstance(gamma, bool) and gamma >= 0)):
            raise ValueError(f"gamma must be 'auto' or an int >= 0 (0: the target alone), got {gamma!r}.")
        if draft is None and gamma not in ("auto", 0):
            raise ValueError(f"gamma={gamma} needs a draft; pass draft= or use gamma=0 (the target alone).")
        self.batch_size = check_int("batch_size", batch_size, 1, "it is the number of decode slots (try 8 to 64).")
        self.read_ahead = check_int("read_ahead", read_ahead, 1, "it is the inputs sorted at a time, in batches.")
        q = max(1, self.batch_size // 4) if refill is None else refill
        self.refill = min(check_int("refill", q, 1, "it is the free slots that start a refill."), self.batch_size)
        self.max_decode_length = check_int("max_decode_length", max_decode_length, 1, "the most output tokens.")
        self.max_input_length = check_int("max_input_length", max_input_length, 1, "T5 was trained with 512.")
        self.eos_id, self.truncate, self.verification = eos_id, truncate, verification
        self.gamma = gamma
        self.target_fns, self.target_params = as_decoding_model(target, "target")
        self.source, self.draft_params = (None, None) if draft is None else as_draft_source(draft)
        if draft_confidence_threshold is not None and self.source is not None:
            if not hasattr(self.source, "confidence_threshold"):
                raise ValueError(
                    "draft_confidence_threshold needs a draft model; a prompt-lookup proposal has no confidence "
                    "(drop it)."
                )
            self.source = dataclasses.replace(self.source, confidence_threshold=draft_confidence_threshold)
        dummy = np.array([[eos_id]], np.int32)
        if draft is not None and gamma != 0:  # every check speculative_sample makes, nothing compiled
            speculative_sample.check_arguments(
                target,
                draft,
                dummy,
                gamma=1,
                max_decode_length=max_decode_length,
                eos_id=eos_id,
                verification=verification,
                draft_confidence_threshold=draft_confidence_threshold,
            )
        elif eos_id >= self.target_fns.vocab_size or eos_id < 0:
            raise ValueError(f"eos_id={eos_id!r} is outside the vocabulary [0, {self.target_fns.vocab_size}).")
        cand = tuple(CANDIDATES if candidates is None else candidates)
        self.decoder = None
        if gamma == "auto":
            self.decoder = Decoder(
                target,
                draft,
                gamma="auto",
                max_decode_length=max_decode_length,
                eos_id=eos_id,
                max_input_length=max_input_length,
                truncate=truncate,
                verification=verification,
                draft_confidence_threshold=draft_confidence_threshold,
                candidates=cand,
                alpha_prior=alpha_prior,
                cost_cache=cost_cache,
                costs=costs,
            )
            self.max_gamma = max(self.decoder.candidates)
        else:
            self.max_gamma = int(gamma)
        self.mesh, self.rules = mesh, rules
        if mesh is not None:
            self._place_on(mesh)
        self.stats = BulkStats()
        self._programs = None
        self._gamma_now = None
        self._status = self._decode_started = None

    def _place_on(self, mesh) -> None:
        """Checks the mesh and places the parameters on it (target split by the rules, draft replicated)."""
        d = mesh.shape["data"] if tuple(getattr(mesh, "axis_names", ())) == ("data", "model") else 1
        if self.batch_size % d:  # each device of the data axis holds the same number of slots
            rounded = -(-self.batch_size // d) * d
            warnings.warn(
                f"batch_size={self.batch_size} decode slots rounded up to {rounded}, a multiple of the mesh's data "
                f"axis of size {d} (outputs are unchanged: a line's result does not depend on the slot count).",
                stacklevel=3,
            )
            self.batch_size = rounded
        check_slot_mesh(mesh, self.batch_size)
        if self.gamma == "auto":
            raise ValueError(
                "gamma='auto' measures its costs on one device; with a mesh pass an int gamma (0: the target alone, "
                "CLI: --gamma N)."
            )
        me = jax.process_index()
        if any(d.process_index != me for d in mesh.devices.flat):
            raise ValueError(
                "the bulk decoder's mesh holds other processes' devices; each process decodes its share of the "
                "input on its own devices: build the mesh with make_mesh(spec, devices=jax.local_devices())."
            )
        self.rules = tuple(parallel.STANDARD_RULES if self.rules is None else self.rules)
        self.target_params = parallel.place_decoding_params(self.target_fns, self.target_params, mesh, self.rules)
        self.draft_params = parallel.place_decoding_params(None, self.draft_params, mesh)  # replicated

    # --- inputs -------------------------------------------------------------------------------------------------
    def _check_row(self, index: int, row) -> np.ndarray:
        """One input as int32[n], checked (ids in the vocabulary, 1 <= n <= max_input_length or cut)."""
        arr = np.asarray(row)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"input {index}: expected a 1-D sequence of token ids, got shape {arr.shape} {arr.dtype}.")
        pad = self.target_fns.pad_id
        n = int(np.max(np.nonzero(arr != pad)[0], initial=-1)) + 1  # trailing padding is not part of the input
        if n == 0:
            raise ValueError(f"input {index} is empty; every input needs at least one token (T5 inputs end with EOS).")
        arr = arr[:n].astype(np.int32)
        if arr.min() < 0 or arr.max() >= self.target_fns.vocab_size:
            raise ValueError(
                f"input {index} holds ids outside the vocabulary [0, {self.target_fns.vocab_size}); was it "
                "encoded with the models' tokenizer?"
            )
        if n > self.max_input_length:
            if not self.truncate:
                raise ValueError(
                    f"input {index} has {n} tokens, more than max_input_length={self.max_input_length}; pass "
                    "truncate=True (CLI: --truncate) to keep its first tokens (ending in EOS)."
                )
            ends_in_eos = arr[-1] == self.eos_id
            arr = arr[: self.max_input_length].copy()
            if ends_in_eos:
                arr[-1] = self.eos_id
        return arr

    # --- γ ----------------------------------------------------------------------------------------------------
    def _rates(self, costs, alpha: float, mean_length: float, gammas) -> dict:
        """{γ: predicted tokens/s of the slots}: ``b`` slots each emit E(α, γ) tokens per iteration, and each
        line costs its share of an encode (``b`` lines)."""
        b = self.batch_size
        out = {}
        for g in gammas:
            per_line = costs.encode[g] / b + mean_length / expected_tokens(alpha, g) * costs.iteration(g) / b
            out[g] = mean_length / max(per_line, 1e-12)
        return out

    def _choose(self, tokens: np.ndarray, greedy: float, kinds) -> tuple[int, str]:
        """(γ, reason) for the slot batch: the best predicted rate among ``kinds`` candidates."""
        decoder = self.decoder
        costs = decoder.costs_for(tokens)
        alpha = decoder.alpha(greedy)
        mean = decoder.mean_length() or max(self.max_decode_length / 4, 1.0)
        rates = self._rates(costs, alpha, mean, [g for g in kinds if g <= costs.max_gamma])
        best = max(rates, key=rates.get)
        last = self._gamma_now
        if last in rates and rates[best] <= rates[last] * (1 + SWITCH_MARGIN):
            best = last
        base = rates.get(0)
        vs = f", {rates[best] / base:.2f}x the target alone" if base else ""
        what = "the target alone" if best == 0 else f"γ {best}"
        table = " ".join(f"{g}:{v:.0f}" for g, v in sorted(rates.items()))
        return best, f"auto: {what} predicted {rates[best]:.0f} tok/s{vs} (α {alpha:.3f}); by γ {table}"

    # --- the loop ----------------------------------------------------------------------------------------------
    def generate(
        self,
        inputs: Iterable[Sequence[int]],
        *,
        rng=None,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        start_index: int = 0,
        progress: bool | dict = False,
    ) -> Iterator[LineResult]:
        """Decodes every input and yields one ``LineResult`` per input, in input order, as soon as it and every
        earlier input are done.

        Args:
          inputs: an iterable of token id sequences (int, EOS-terminated as the tokenizer makes them; trailing
            ``pad_id`` ignored); read lazily, ``read_ahead × batch_size`` at a time. On several processes every
            process passes the same inputs and decodes its share (the module docstring).
          rng: None (seed 0), an int seed or a PRNG key; input ``i`` samples with ``fold_in(key, i)``.
          temperature, top_k, top_p: as ``speculative_sample`` (one value for every input).
          start_index: the index of the first input (a resumed run passes the lines already done, so keys and
            outputs match an uninterrupted run).
          progress: a tqdm progress bar on stderr (lines, tokens/s, α; on process 0 only); a dict is passed to
            ``tqdm`` (e.g. ``total``, ``initial``, ``desc``).
        Yields:
          ``LineResult`` for inputs ``start_index``, ``start_index + 1``, ...
        Raises:
          ValueError: an input that is empty, holds ids outside the vocabulary, or is longer than
            ``max_input_length`` without ``truncate`` (naming its index; raised after every line before it is
            yielded, so nothing valid is lost); sampling values out of range.
        """
        validate_sampling(temperature, top_k, top_p)
        key = raw_keys(rng, 1)
        if key.ndim != 1:
            raise ValueError("rng must be one key or an int seed for a bulk decode (line i uses fold_in(key, i)).")
        key = jax.numpy.asarray(key)
        me, count, exchange = _processes()
        stats = self.stats = BulkStats()
        t0 = time.perf_counter()
        bar = None
        if progress and me == 0:
            import sys

            from tqdm import tqdm

            options = dict(unit="line", file=sys.stderr, desc="generate", dynamic_ncols=True)
            options.update(progress if isinstance(progress, dict) else {})
            bar = tqdm(**options)
        pairs = process_share(enumerate(inputs, start_index), me, count)
        self._status = (lambda text: _bar_status(bar, text)) if bar is not None else None
        self._decode_started = None  # perf_counter at the first decode step (``_run_slots``)
        stream = self._decode(pairs, key, temperature, top_k, top_p, t0)
        if count > 1:
            stream = merge_processes(stream, exchange, self.batch_size, self.max_decode_length)  # rounds of b
        first = True
        try:
            with stored.listening(self._on_program):
                for r in stream:
                    if bar is not None:
                        if first:  # no estimate until lines flow; the rate counts from the first decode step on
                            _bar_status(bar, None)
                            decoding = time.perf_counter() - (self._decode_started or time.perf_counter())
                            bar.start_t = bar.last_print_t = bar._time() - decoding
                            first = False
                        bar.update(1)
                        alpha = f"{stats.alpha:.2f}" if stats.verified else "-"
                        decoding = time.perf_counter() - (self._decode_started or t0)
                        bar.set_postfix_str(
                            f"{stats.tokens / max(decoding, 1e-9):.0f} tok/s, α {alpha}, γ {self._gamma_now}",
                            refresh=False,
                        )
                    yield r
        finally:
            stats.seconds = time.perf_counter() - t0
            if bar is not None:
                bar.close()

    def _on_program(self, name: str, what: str) -> None:
        """``stored.listening``'s callback: counts this call's program builds and loads, and says on the progress
        bar what is being built."""
        stats = self.stats
        if what in ("building", "loading"):
            self._program_t0 = time.perf_counter()
            done = stats.programs_built + stats.programs_loaded
            verb = "building" if what == "building" else "loading"
            if self._status is not None:
                self._status(f"{verb} program {done + 1} ({name}; {stats.programs_built} built so far)")
            return
        stats.program_seconds += time.perf_counter() - getattr(self, "_program_t0", time.perf_counter())
        if self._status is not None:
            self._status(None)
        if what == "loaded":
            stats.programs_loaded += 1
        else:
            stats.programs_built += 1

    def _decode(self, pairs: Iterator, key, temperature, top_k, top_p, t0: float) -> Iterator[LineResult]:
        """This process's decode: ``pairs`` (index, row) through the slots, ``LineResult`` in the order of
        ``pairs``; updates ``self.stats``. Its stages, one method each:

            fill (read a window, sort it, insert the longest into free slots) → run (until enough slots are
            done) → collect (the finished rows leave the devices) → learn (γ auto) → emit (in input order)

        An input refused by ``_check_row`` ends the reading: every line before it is decoded and yielded first,
        then its ``ValueError`` is raised."""
        run = _Run(pairs, key, [-1] * self.batch_size, 1.0 if temperature <= 0 else 0.0, (temperature, top_k, top_p))
        run.gamma = self._gamma_now  # a later call goes on with the γ the last one ran
        while True:
            self._fill(run)
            if all(s < 0 for s in run.slot_line):
                break
            done = self._run_slots(run, t0)
            lines = self._collect(run, done)
            self._learn(run, lines)
            yield from self._emit(run, t0)
            self.stats.seconds = time.perf_counter() - t0
        while run.order and run.order[0] in run.finished:  # nothing can be left, but never lose a line
            yield run.finished.pop(run.order.popleft())
        if run.refused is not None:
            raise run.refused

    def _read_window(self, run: "_Run") -> list:
        """The next ``read_ahead × b`` inputs, checked and sorted by length (shortest first: ``pop()`` takes the
        longest); their indices join the emit order. Stops at the end of the input or at a refused input."""
        window = []
        for _ in range(self.read_ahead * self.batch_size):
            try:
                i, row = next(run.pairs)
                window.append((i, self._check_row(i, row)))
            except StopIteration:
                run.exhausted = True
                break
            except ValueError as e:  # no more reading; the lines before it finish first
                run.exhausted, run.refused = True, e
                break
            run.order.append(i)
        window.sort(key=lambda x: (len(x[1]), -x[0]))
        return window

    def _fill(self, run: "_Run") -> None:
        """Fill: the free slots take the longest inputs of the window (a new window when it is empty), encoded by
        one insert program (the slot state widened first when they need a wider encoder memory)."""
        b, pad = self.batch_size, self.target_fns.pad_id
        free = [s for s in range(b) if run.slot_line[s] < 0]
        if free and not run.pending and not run.exhausted:
            run.pending = self._read_window(run)
        take = []
        while run.pending and len(take) < len(free):
            take.append(run.pending.pop())
        if not take:
            return
        longest = max(len(r) for _, r in take)
        need = _bucket(max(longest, 1), self.max_input_length)
        if self._programs is None:  # the first inputs: choose the kind (γ auto) and build the programs
            run.gamma = self._gamma_now = self._first_gamma(take, need, run.greedy)
            self._programs = SlotPrograms.shared(
                self.target_fns,
                self.source if self.max_gamma > 0 else None,
                batch=b,
                max_decode_length=self.max_decode_length,
                max_gamma=self.max_gamma,
                eos_id=self.eos_id,
                verification=self.verification,
                mesh=self.mesh,
                rules=self.rules,
            )
        programs = self._programs
        if run.slots is None:
            run.width = need
            run.slots = programs.empty(self.target_params, self.draft_params, run.width)
        elif need > run.width:
            run.width = need
            run.slots = programs.widen(self.target_params, self.draft_params, run.slots, run.width)
        m = _group_size(len(take), self.refill, b, None if self.mesh is None else programs.row_multiple)
        tokens = np.full((m, run.width), pad, np.int32)
        ids = np.full((m,), b, np.int32)  # b: dropped
        lines = np.zeros((m,), np.int32)
        for j, ((i, row), s) in enumerate(zip(take, free)):
            tokens[j, : len(row)] = row
            ids[j], lines[j] = s, i
            run.slot_line[s] = i
        keys = _line_keys(run.key, lines)
        sampling = SamplingParams.broadcast(m, *run.sampling)
        run.slots = programs.insert(
            self.target_params, self.draft_params, run.slots, tokens, ids, keys, sampling, count=len(take)
        )

    def _run_slots(self, run: "_Run", t0: float) -> np.ndarray:
        """Run: the loop over every slot until enough are done to refill (``refill`` more than are idle; all of
        them once the input is read); returns the done flags bool[b]."""
        b, stats = self.batch_size, self.stats
        more = bool(run.pending) or not run.exhausted
        idle = sum(1 for s in run.slot_line if s < 0)
        first, before, building = stats.first_step_seconds is None, time.perf_counter(), stats.program_seconds
        min_done = min(b, idle + self.refill) if more else b
        run.slots, iterations, done = self._programs.run(
            self.target_params, self.draft_params, run.slots, run.gamma, min_done, self.max_decode_length
        )
        if first:  # the first step starts once the run program is built or loaded (inside that call)
            stats.first_step_seconds = before - t0 + (stats.program_seconds - building)
            self._decode_started = before + (stats.program_seconds - building)
        done = np.asarray(jax.device_get(done))
        stats.runs += 1
        stats.iterations += int(iterations)
        stats.gammas[run.gamma] = stats.gammas.get(run.gamma, 0) + 1
        return done

    def _collect(self, run: "_Run", done: np.ndarray) -> list:
        """Collect: only the rows finished in this run leave the devices (one collect program of ``b`` rows);
        their ``LineResult``s wait in ``run.finished`` and their slots are free. Returns them."""
        b = self.batch_size
        ended = [s for s in range(b) if run.slot_line[s] >= 0 and done[s]]
        if not ended:
            return []
        got = self._programs.collect(run.slots, np.array(ended + [ended[0]] * (b - len(ended)), np.int32))
        out = []
        for j, s in enumerate(ended):
            n = int(got["lengths"][j])
            r = LineResult(
                run.slot_line[s],
                np.array(got["sequences"][j, :n], np.int32),
                int(got["target_calls"][j]),
                int(got["draft_tokens"][j]),
                int(got["accepted"][j]),
                float(got["beta_sum"][j]),
                int(got["num_verified"][j]),
                run.gamma,
            )
            run.finished[r.index] = r
            run.slot_line[s] = -1
            out.append(r)
        return out

    def _learn(self, run: "_Run", lines: list) -> None:
        """Learn (γ auto): the finished lines' α sums and lengths go to the ``Decoder``'s running α and recent
        lengths; every ``RECHOOSE_EVERY`` speculative runs γ is chosen again (0 included: the draft may not pay)."""
        if self.decoder is None or not lines:
            return
        d, b = self.decoder, self.batch_size
        beta = sum(r.beta_sum for r in lines)
        verified = sum(r.num_verified for r in lines)
        d.observe(bool(run.greedy), beta, verified, [len(r.tokens) for r in lines], b)
        if run.gamma > 0 and self.stats.runs % RECHOOSE_EVERY == 0:
            probe = np.full((b, run.width), self.target_fns.pad_id, np.int32)
            probe[:, 0] = self.eos_id
            g, why = self._choose(probe, run.greedy, d.candidates)
            if g != run.gamma:
                self.stats.reasons.append(why)
            run.gamma = self._gamma_now = g

    def _emit(self, run: "_Run", t0: float) -> Iterator[LineResult]:
        """Emit: the finished lines whose every earlier line is out, in input order; counted in ``self.stats``."""
        stats = self.stats
        while run.order and run.order[0] in run.finished:
            r = run.finished.pop(run.order.popleft())
            stats.lines += 1
            stats.tokens += len(r.tokens)
            stats.beta_sum += r.beta_sum
            stats.verified += r.num_verified
            stats.drafted += r.num_draft_tokens
            stats.accepted += r.num_accepted
            stats.target_calls += r.num_target_calls
            stats.seconds = time.perf_counter() - t0
            if stats.first_line_seconds is None:
                stats.first_line_seconds = stats.seconds
            yield r

    def _first_gamma(self, take, width: int, greedy: float) -> int:
        """The γ of the first run: the fixed γ, or γ auto's choice of kind (and γ) from the costs at ``b`` slots
        and width ``width`` (measured once per machine and shape, ``Decoder.costs_for``)."""
        if self.decoder is None:
            return int(self.gamma)
        t0 = time.perf_counter()
        try:
            return self._choose_first(take, width, greedy)
        finally:
            self.stats.gamma_seconds += time.perf_counter() - t0

    def _choose_first(self, take, width: int, greedy: float) -> int:
        if self.decoder.candidates == (0,):
            self.max_gamma = 0
            self.stats.reasons.append("auto: no draft, the target alone")
            return 0
        b = self.batch_size
        probe = np.full((b, width), self.target_fns.pad_id, np.int32)
        for j in range(b):
            row = take[j % len(take)][1]
            probe[j, : len(row)] = row
        if self._status is not None and not self.decoder.costs_known(probe):
            self._status("measuring γ auto's costs (once per machine, models and shape)")
        g, why = self._choose(probe, greedy, self.decoder.candidates)
        self.stats.reasons.append(why)
        if g == 0:
            self.max_gamma = 0  # the target alone for the whole run: no draft state in the slots
        self._gamma_now = g
        return g


def generate_iterable(target, draft, inputs: Iterable[Sequence[int]], **kwargs) -> Iterator[LineResult]:
    """``BulkDecoder(target, draft, **settings).generate(inputs, **sampling)`` in one call (CTranslate2's
    ``translate_iterable``): ``kwargs`` are split between the two by name. Yields ``LineResult`` in input order.

    Raises:
      ValueError: see ``BulkDecoder`` and ``BulkDecoder.generate``.
    """
    call = {
        k: kwargs.pop(k) for k in ("rng", "temperature", "top_k", "top_p", "start_index", "progress") if k in kwargs
    }
    return BulkDecoder(target, draft, **kwargs).generate(inputs, **call)

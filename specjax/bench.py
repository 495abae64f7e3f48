"""Measuring speculative sampling against the baseline, side by side in one run.

Everything here times compiled programs only (compile time is measured apart, on a first call of each
shape), alternates the two methods on the same inputs, and reports ratios, never absolute thresholds.
Theory (Leviathan et al. 2023, section 3.1 and Theorem 3.8): with acceptance rate α, γ draft tokens per
iteration and cost ratio c (one draft step over one target call),
  expected tokens per target call       = (1 − α^(γ+1)) / (1 − α)
  expected walltime improvement factor  = (1 − α^(γ+1)) / ((1 − α)(γc + 1)).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding import DecodeResult, speculative_sample, temperature_sample
from specjax.models import t5
from specjax.models.t5 import T5Model

__all__ = [
    "expected_tokens_per_call", "expected_improvement", "alpha_from_tokens_per_call", "measure_cost_ratio",
    "PairMeasurement",
    "measure_pair", "pad_batches", "environment", "measure_costs", "profile_pieces", "format_profile",
    "BenchRow", "load_experiment", "read_lines", "encode_inputs", "quality", "run_row", "format_markdown",
    "write_csv", "plot_records", "goal_ratios", "format_goals", "TABLE_COLUMNS", "CSV_COLUMNS", "GOALS",
]


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """(1 − α^(γ+1)) / (1 − α): expected tokens per target call (Leviathan et al. 2023, eq. 1); γ+1 at α=1."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_improvement(alpha: float, gamma: int, c: float) -> float:
    """(1 − α^(γ+1)) / ((1 − α)(γc + 1)): expected walltime speedup (Leviathan et al. 2023, Theorem 3.8)."""
    return expected_tokens_per_call(alpha, gamma) / (gamma * c + 1.0)


def alpha_from_tokens_per_call(tokens_per_call: float, gamma: int) -> float:
    """The per-token acceptance probability α (the paper's E[β], section 3.1) that makes the expected tokens
    per target call (1 − α^(γ+1)) / (1 − α) equal the measured ``tokens_per_call`` (bisection, 1e-9).

    The paper's formulas take this per-token α. The acceptance rate ``DecodeResult.acceptance_rate``
    (accepted / drafted) is smaller for γ > 1: drafts after the first rejection of an iteration are never
    tested but are counted as drafted (at γ = 1 the two agree). Rows clipped by EOS or by
    ``max_decode_length`` emit fewer tokens in their last iteration, which biases this estimate slightly low.
    """
    lo, hi = 0.0, 1.0
    if tokens_per_call <= 1.0:
        return 0.0
    if tokens_per_call >= gamma + 1:
        return 1.0
    while hi - lo > 1e-9:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_call(mid, gamma) < tokens_per_call else (lo, mid)
    return (lo + hi) / 2


def environment() -> dict:
    """jax version, backend, device kind and count: recorded with every result."""
    devices = jax.devices()
    return {"jax": jax.__version__, "backend": jax.default_backend(),
            "device_kind": devices[0].device_kind, "device_count": len(devices)}


def pad_batches(rows: Sequence[Sequence[int]], batch_size: int, length: int | None = None,
                pad_id: int = 0) -> list[np.ndarray]:
    """Token id lists -> int32[batch_size, L] arrays (the last batch padded with copies of its first row,
    which callers drop); L = ``length`` or the next power of two >= the longest row (>= 8), so every batch
    of a run shares one compiled shape."""
    if not rows:
        raise ValueError("No inputs to batch.")
    longest = max(len(r) for r in rows)
    L = length or max(8, 1 << (longest - 1).bit_length())
    if longest > L:
        raise ValueError(f"An input has {longest} tokens, more than the padded length {L}.")
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = list(rows[start:start + batch_size])
        chunk += [chunk[0]] * (batch_size - len(chunk))
        arr = np.full((batch_size, L), pad_id, np.int32)
        for i, r in enumerate(chunk):
            arr[i, :len(r)] = r
        out.append(arr)
    return out


# ----------------------------------------------------------------------------------------------------------
# The cost ratio c


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _steps(config, params, encoded, cache, k: int, n: int):
    """n decode calls of a k-token window in one jitted loop (what the decode loop runs)."""
    b = cache.k.shape[1]

    def body(i, carry):
        cache, acc = carry
        tokens = jnp.full((b, k), 3, jnp.int32) + (acc[:, None] > 1e30)  # data dependence: no hoisting
        logits, cache = t5.decode(config, params, encoded, tokens, cache, jnp.full((b,), i % 8, jnp.int32))
        return cache, acc + logits[:, -1, 0]

    return jax.lax.fori_loop(0, n, body, (cache, jnp.zeros((b,), jnp.float32)))[1]


def _time_steps(model: T5Model, encoder_input_tokens, k: int, n: int, repeats: int) -> float:
    encoded = model.encode(encoder_input_tokens)
    cache = model.init_cache(encoder_input_tokens.shape[0], 16 + k)
    jax.block_until_ready(_steps(model.config, model.params, encoded, cache, k, n))  # compile
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(_steps(model.config, model.params, encoded, cache, k, n))
        best = min(best, time.perf_counter() - t0)
    return best / n


def measure_cost_ratio(target: T5Model, draft: T5Model, encoder_input_tokens, gamma: int,
                       steps: int = 64, repeats: int = 5) -> dict:
    """Measures one decode call of each model inside a jitted loop (seconds per call, best of ``repeats``).

    Args:
      encoder_input_tokens: int32[b, s] (the batch size matters: c depends on it).
    Returns:
      dict with ``draft_step_s`` (k=1), ``target_step_s`` (k=1), ``target_window_s`` (k=γ+1),
      ``c`` = draft_step_s / target_step_s (the paper's cost ratio, which assumes a window costs as much as
      one step), and ``window_over_step`` = target_window_s / target_step_s (how far that assumption holds).
    """
    tokens = np.asarray(encoder_input_tokens, np.int32)
    d = _time_steps(draft, tokens, 1, steps, repeats)
    t1 = _time_steps(target, tokens, 1, steps, repeats)
    tw = _time_steps(target, tokens, gamma + 1, steps, repeats)
    return {"draft_step_s": d, "target_step_s": t1, "target_window_s": tw, "c": d / t1,
            "window_over_step": tw / t1}


# ----------------------------------------------------------------------------------------------------------
# Speculative vs baseline


@dataclasses.dataclass
class PairMeasurement:
    """Speculative sampling and temperature_sample on the same inputs, timed alternately after compilation.

    Attributes:
      spec_seconds, base_seconds: total wall time (seconds) over all batches and repeats (compiled calls).
      spec_compile_seconds, base_compile_seconds: the first call of each (compile + run), seconds.
      spec, base: ``DecodeResult`` per batch (from the last repeat).
      num_inputs: real rows (padding rows excluded).
    """
    spec_seconds: float
    base_seconds: float
    spec_compile_seconds: float
    base_compile_seconds: float
    spec: list[DecodeResult]
    base: list[DecodeResult]
    num_inputs: int

    def _rows(self, results, field):
        vals = np.concatenate([getattr(r, field) for r in results])
        return vals[:self.num_inputs]

    @property
    def speedup(self) -> float:
        """base_seconds / spec_seconds."""
        return self.base_seconds / self.spec_seconds

    @property
    def acceptance_rate(self) -> float:
        """α over all real rows: accepted / drafted."""
        return float(self._rows(self.spec, "num_accepted").sum() / max(1, self._rows(self.spec, "num_draft_tokens").sum()))

    @property
    def row_acceptance_rates(self) -> np.ndarray:
        """float[num_inputs] α per row (NaN where nothing was drafted)."""
        drafted = self._rows(self.spec, "num_draft_tokens").astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return self._rows(self.spec, "num_accepted") / drafted

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
        return int(sum(int(np.max(r.num_target_calls)) for r in self.spec))

    def sequences(self, which: str = "spec") -> list[np.ndarray]:
        """Output token rows (real rows only), each trimmed to its length."""
        results = self.spec if which == "spec" else self.base
        seqs = np.concatenate([r.sequences for r in results])[:self.num_inputs]
        lens = self._rows(results, "lengths")
        return [s[:n] for s, n in zip(seqs, lens)]


def measure_pair(target: T5Model, draft: T5Model, batches: Sequence[np.ndarray], *, gamma: int,
                 temperature: float, max_decode_length: int, num_inputs: int | None = None, seed: int = 0,
                 repeats: int = 1, top_k: int = 0, top_p: float = 1.0, max_input_length: int = 512,
                 truncate: bool = False, on_batch: Callable[[], None] | None = None) -> PairMeasurement:
    """Runs speculative_sample and temperature_sample on the same batches, alternating, after compiling each.

    Args:
      batches: int32[b, s] arrays sharing one shape (see ``pad_batches``).
      num_inputs: real rows in total (trailing padding rows of the last batch are excluded from counts).
      seed: batch ``j`` uses ``PRNGKey(seed + j)`` for both methods.
      repeats: passes over all batches; times are summed, results kept from the last pass.
      max_input_length, truncate: passed to both decode functions (longer inputs are cut when truncate).
      on_batch: called after each batch (progress bars).
    Returns:
      ``PairMeasurement``.
    Raises:
      ValueError: from the decode functions' validation (gamma, temperature, …) before compiling.
    """
    kw = dict(max_decode_length=max_decode_length, temperature=temperature, top_k=top_k, top_p=top_p,
              max_input_length=max_input_length, truncate=truncate)

    def spec(j, x):
        r = speculative_sample(target, draft, x, rng=jax.random.PRNGKey(seed + j), gamma=gamma, **kw)
        return r

    def base(j, x):
        return temperature_sample(target, x, rng=jax.random.PRNGKey(seed + j), **kw)

    t0 = time.perf_counter()
    spec(0, batches[0])
    spec_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    base(0, batches[0])
    base_compile = time.perf_counter() - t0
    spec_s = base_s = 0.0
    for _ in range(repeats):
        spec_results, base_results = [], []
        for j, x in enumerate(batches):
            order = (spec, base) if j % 2 == 0 else (base, spec)  # alternate who goes first
            for fn in order:
                t0 = time.perf_counter()
                r = fn(j, x)  # DecodeResult holds numpy arrays: the call has finished
                dt = time.perf_counter() - t0
                if fn is spec:
                    spec_s += dt
                    spec_results.append(r)
                else:
                    base_s += dt
                    base_results.append(r)
            if on_batch:
                on_batch()
    n = num_inputs if num_inputs is not None else sum(b.shape[0] for b in batches)
    return PairMeasurement(spec_s, base_s, spec_compile, base_compile, spec_results, base_results, n)


# ----------------------------------------------------------------------------------------------------------
# Costs and profile: the pieces of one speculative iteration, timed in jitted loops


def measure_costs(target: T5Model, draft: T5Model, encoder_input_tokens, gammas: Sequence[int],
                  steps: int = 32, repeats: int = 3) -> dict:
    """``measure_cost_ratio`` for several γ at once (the k=1 steps are timed once, the windows per γ).

    Args:
      encoder_input_tokens: int32[b, s].
      gammas: the γ values whose target windows (k = γ+1) to time.
    Returns:
      dict with ``draft_step_s``, ``target_step_s``, ``c`` (seconds per call; c = draft/target) and
      ``target_window_s`` / ``window_over_step``: dicts γ -> seconds / ratio.
    """
    tokens = np.asarray(encoder_input_tokens, np.int32)
    d = _time_steps(draft, tokens, 1, steps, repeats)
    t1 = _time_steps(target, tokens, 1, steps, repeats)
    windows = {int(g): _time_steps(target, tokens, int(g) + 1, steps, repeats) for g in sorted(set(gammas))}
    return {"draft_step_s": d, "target_step_s": t1, "c": d / t1, "target_window_s": windows,
            "window_over_step": {g: w / t1 for g, w in windows.items()}}


@functools.partial(jax.jit, static_argnums=(0,))
def _encode_jit(config, params, tokens):
    return t5.encode(config, params, tokens)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _accept_steps(sampler, p_logits, q_logits, tokens, n: int):
    """n accept/resample steps over a batch (warping of p and q included), in one jitted loop."""
    from specjax.sampling import accept_or_resample

    b = p_logits.shape[0]

    def body(i, acc):
        shift = (acc > 1e30).astype(jnp.float32)  # data dependence: no hoisting
        p = sampler.probs(p_logits + shift)  # [b, g, v]
        q = sampler.probs(q_logits + shift)  # [b, g+1, v]
        keys = jax.random.split(jax.random.PRNGKey(i), b)
        rule = functools.partial(accept_or_resample, greedy=sampler.greedy)
        n_acc, nxt = jax.vmap(rule)(keys, tokens, p, q)
        return acc + n_acc + nxt

    return jax.lax.fori_loop(0, n, body, jnp.zeros((b,), jnp.int32))


def _best_time(fn, repeats: int) -> float:
    jax.block_until_ready(fn())  # compile
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def profile_pieces(target: T5Model, draft: T5Model, encoder_input_tokens, *, gamma: int,
                   temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, steps: int = 32,
                   repeats: int = 3) -> dict:
    """Times the pieces of one speculative iteration, each compiled and looped as in the decode loop.

    Args:
      encoder_input_tokens: int32[b, s] (one batch as the bench runs it).
      gamma: γ; the target window is k = γ+1 tokens.
      temperature, top_k, top_p: the warping applied in the accept step.
    Returns:
      dict of seconds: ``target_encode``, ``draft_encode`` (once per call), ``draft_step`` (k=1),
      ``target_step`` (k=1), ``target_window`` (k=γ+1), ``accept`` (warping p and q + acceptance rule +
      resampling, the whole batch), and ``iteration_estimate`` = γ·draft_step + target_window + accept.
    """
    from specjax.sampling import Sampler

    tokens = jnp.asarray(np.asarray(encoder_input_tokens, np.int32))
    b = tokens.shape[0]
    out = {
        "target_encode": _best_time(lambda: _encode_jit(target.config, target.params, tokens), repeats),
        "draft_encode": _best_time(lambda: _encode_jit(draft.config, draft.params, tokens), repeats),
    }
    costs = measure_costs(target, draft, tokens, [gamma], steps, repeats)
    out["draft_step"] = costs["draft_step_s"]
    out["target_step"] = costs["target_step_s"]
    out["target_window"] = costs["target_window_s"][gamma]
    v = target.config.vocab_size
    rng = np.random.default_rng(0)
    p_logits = jnp.asarray(rng.normal(size=(b, gamma, v)).astype(np.float32))
    q_logits = jnp.asarray(rng.normal(size=(b, gamma + 1, v)).astype(np.float32))
    drafted = jnp.asarray(rng.integers(0, v, size=(b, gamma)).astype(np.int32))
    sampler = Sampler(float(temperature), int(top_k), float(top_p))
    out["accept"] = _best_time(lambda: _accept_steps(sampler, p_logits, q_logits, drafted, steps), repeats) / steps
    out["iteration_estimate"] = gamma * out["draft_step"] + out["target_window"] + out["accept"]
    return out


def format_profile(pieces: dict, gamma: int, measured_iteration_s: float | None = None) -> str:
    """Text table of ``profile_pieces`` output: milliseconds and share of one iteration.

    Args:
      measured_iteration_s: seconds per loop iteration measured end to end (``spec_seconds`` over
        ``spec_iterations``); the gap to the estimate is the loop's own overhead (bookkeeping, copies).
    """
    it = pieces["iteration_estimate"]
    lines = [f"where the time goes (γ={gamma}; one iteration = γ draft steps + 1 target window + accept):",
             f"  {'piece':<28}{'ms':>10}{'share':>9}"]
    rows = [("draft step x γ", gamma * pieces["draft_step"]), ("target window (k=γ+1)", pieces["target_window"]),
            ("accept + resample", pieces["accept"])]
    for name, s in rows:
        lines.append(f"  {name:<28}{s * 1e3:>10.3f}{s / it:>8.0%}")
    lines.append(f"  {'= iteration (estimate)':<28}{it * 1e3:>10.3f}")
    if measured_iteration_s:
        lines.append(f"  {'iteration (measured)*':<28}{measured_iteration_s * 1e3:>10.3f}"
                     f"   overhead {(measured_iteration_s - it) * 1e3:+.3f} ms "
                     f"({(measured_iteration_s - it) / measured_iteration_s:+.0%})")
    if measured_iteration_s:
        lines.append("  * end-to-end call time / iterations: includes encoding, dispatch and host transfer per call")
    lines.append(f"  once per call: target encode {pieces['target_encode'] * 1e3:.3f} ms, "
                 f"draft encode {pieces['draft_encode'] * 1e3:.3f} ms")
    lines.append(f"  target step (k=1) {pieces['target_step'] * 1e3:.3f} ms; window/step "
                 f"{pieces['target_window'] / pieces['target_step']:.2f}; c = draft/target step "
                 f"{pieces['draft_step'] / pieces['target_step']:.3f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# Experiments: rows of a Table-2 style run (configs/*.json)


@dataclasses.dataclass(frozen=True)
class BenchRow:
    """One row of an experiment: a task, a target/draft pair, a temperature and the γ values to run.

    Attributes:
      task: task name as printed ("EnDe", "CNNDM", "multi30k" …).
      target, draft: model names as printed (keys of the experiment's ``models``).
      target_path, draft_path: checkpoint paths (local, ``gs://``) or ``default:target``,
        ``default:distilled``, ``default:reference`` for the shipped pair.
      temperature: sampling temperature (0 = greedy).
      gammas: γ values (each a table row).
      input: text file, one input per line.
      prefix: task prefix prepended to every input ("translate English to German: ", "summarize: ").
      references: line-aligned reference file (or None): BLEU / ROUGE when given.
      metric: "bleu" (sacrebleu), "rouge" (rouge-score ROUGE-1/2/L F) or None.
      tokenizer: SentencePiece model path, ``gs://`` path, or "default" (the shipped pair's).
      max_input_length: inputs are truncated to this many tokens (EOS kept).
      max_decode_length: most output tokens per input.
      num_inputs: how many input lines to use (the first ones).
      paper_alpha, paper_speedup: the paper's numbers for this row (None when it has none).
    """
    task: str
    target: str
    draft: str
    target_path: str
    draft_path: str
    temperature: float
    gammas: tuple[int, ...]
    input: str
    prefix: str = ""
    references: str | None = None
    metric: str | None = None
    tokenizer: str = "default"
    max_input_length: int = 512
    max_decode_length: int = 64
    num_inputs: int = 32
    paper_alpha: float | None = None
    paper_speedup: float | None = None


_TASK_KEYS = {"input", "references", "prefix", "metric", "max_input_length", "max_decode_length", "num_inputs",
              "tokenizer"}


def load_experiment(path: str) -> tuple[dict, list[BenchRow]]:
    """Reads an experiment file (``configs/paper_table2.json`` layout, see ``configs/README.md``).

    Returns:
      (the file's top-level metadata without ``rows``, the expanded ``BenchRow`` list in file order).
    Raises:
      FileNotFoundError: no such file. ValueError: malformed JSON, a row naming an unknown model or task,
        unknown keys, or a missing field (the message names the row).
    """
    import json

    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}).") from e
    models, tasks = spec.get("models", {}), spec.get("tasks", {})
    rows = []
    for i, r in enumerate(spec.get("rows", [])):
        where = f"{path}: row {i} ({r.get('task')}, {r.get('draft')})"
        unknown = set(r) - {"task", "target", "draft", "temperature", "gamma", "paper"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}.")
        for key in ("task", "target", "draft", "temperature", "gamma"):
            if key not in r:
                raise ValueError(f"{where}: missing {key!r}.")
        if r["task"] not in tasks:
            raise ValueError(f"{where}: task {r['task']!r} is not in the file's tasks {sorted(tasks)}.")
        for key in ("target", "draft"):
            if r[key] not in models:
                raise ValueError(f"{where}: {key} {r[key]!r} is not in the file's models {sorted(models)}.")
        task = dict(tasks[r["task"]])
        bad = set(task) - _TASK_KEYS
        if bad:
            raise ValueError(f"{path}: task {r['task']!r} has unknown keys {sorted(bad)}.")
        task.setdefault("tokenizer", spec.get("tokenizer", "default"))
        gammas = r["gamma"] if isinstance(r["gamma"], list) else [r["gamma"]]
        paper = r.get("paper") or {}
        rows.append(BenchRow(task=r["task"], target=r["target"], draft=r["draft"], target_path=models[r["target"]],
                             draft_path=models[r["draft"]], temperature=float(r["temperature"]),
                             gammas=tuple(int(g) for g in gammas), paper_alpha=paper.get("alpha"),
                             paper_speedup=paper.get("speedup"), **task))
    if not rows:
        raise ValueError(f"{path}: no rows.")
    meta = {k: v for k, v in spec.items() if k != "rows"}
    return meta, rows


def read_lines(path: str, limit: int | None = None) -> list[str]:
    """Non-empty-trimmed lines of a UTF-8 text file (empty lines kept as "" to stay aligned with references),
    the first ``limit`` of them.

    Raises:
      FileNotFoundError: the file is missing (the message says where the shared data lives).
    """
    import os

    if not os.path.isfile(path):
        raise FileNotFoundError(f"Input file {path!r} does not exist (relative paths are read from the current "
                                f"directory {os.getcwd()!r}; the project's data lives in ../shared/data).")
    with open(path, encoding="utf-8") as f:
        lines = [l.rstrip("\n").strip() for l in f]
    return lines[:limit] if limit else lines


def encode_inputs(tokenizer, lines: Sequence[str], prefix: str, max_input_length: int) -> list[list[int]]:
    """Token ids (with EOS) of ``prefix + line``, each truncated to ``max_input_length`` tokens ending in EOS
    (as ``truncate=True`` in the decode functions does), so batches stay small."""
    out = []
    for line in lines:
        ids = tokenizer.encode(prefix + line)
        if len(ids) > max_input_length:
            ids = ids[:max_input_length - 1] + [tokenizer.eos_id]
        out.append(ids)
    return out


def quality(hypotheses: Sequence[str], references: Sequence[str], metric: str) -> dict:
    """Corpus quality of outputs against references.

    Args:
      metric: "bleu" (sacrebleu corpus BLEU, default 13a tokenisation) or "rouge" (rouge-score ROUGE-1,
        ROUGE-2, ROUGE-Lsum F-measure x100, mean over inputs, with stemming).
    Returns:
      dict metric name -> score; ``{}`` with a note when rouge-score is not installed
      (``pip install specjax[bench]``).
    Raises:
      ValueError: unknown metric, or hypotheses and references of different lengths.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} outputs but {len(references)} references.")
    if metric == "bleu":
        import sacrebleu

        return {"bleu": float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)}
    if metric == "rouge":
        try:
            from rouge_score import rouge_scorer
        except ImportError:
            return {"note": "rouge-score not installed (pip install 'specjax[bench]')"}
        scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"], use_stemmer=True)
        scores = [scorer.score(r, h) for h, r in zip(hypotheses, references)]
        return {k: float(np.mean([s[k].fmeasure for s in scores]) * 100) for k in ("rouge1", "rouge2", "rougeLsum")}
    raise ValueError(f"Unknown metric {metric!r}; use 'bleu' or 'rouge'.")


def run_row(target: T5Model, draft: T5Model, tokenizer, row: BenchRow, *, batch_sizes: Sequence[int] = (1,),
            repeats: int = 1, seed: int = 0, cost_steps: int = 32, with_quality: bool = True,
            on_batch: Callable[[], None] | None = None) -> list[dict]:
    """Measures one ``BenchRow`` at each of its γ and each batch size: one record per (γ, batch size).

    Both methods run on the same inputs in the same process, alternating (``measure_pair``); c is measured
    at each batch size (``measure_costs``); theory uses the measured α and c.

    Returns:
      list of dicts with: task, target, draft, temperature, gamma, batch_size, num_inputs, alpha (overall),
      alpha_rows (per input, NaN where nothing was drafted), tokens_per_call, expected_tokens_per_call,
      c, draft_step_ms, target_step_ms, target_window_ms, window_over_step, expected_improvement (paper),
      expected_improvement_window (the same with the measured window cost: tokens / (γc + window/step)),
      speedup (measured), speedup_over_expected, spec_seconds, base_seconds, spec_compile_seconds,
      base_compile_seconds (seconds), spec_tokens_per_s, base_tokens_per_s, iteration_ms, greedy_identical
      (temperature 0: speculative == temperature_sample token for token), quality_spec / quality_base,
      paper_alpha, paper_speedup, and ``environment()``.
    Raises:
      FileNotFoundError: missing input or reference file. ValueError: as ``measure_pair``.
    """
    lines = read_lines(row.input, row.num_inputs)
    if not lines:
        raise ValueError(f"{row.input} has no lines.")
    refs = read_lines(row.references, row.num_inputs) if (row.references and with_quality and row.metric) else None
    ids = encode_inputs(tokenizer, lines, row.prefix, row.max_input_length)
    env = environment()
    records = []
    for bs in batch_sizes:
        batches = pad_batches(ids, batch_size=bs, pad_id=target.config.pad_id)
        costs = measure_costs(target, draft, batches[0], row.gammas, steps=cost_steps)
        for gamma in row.gammas:
            m = measure_pair(target, draft, batches, gamma=gamma, temperature=row.temperature,
                             max_decode_length=row.max_decode_length, num_inputs=len(ids), seed=seed,
                             repeats=repeats, max_input_length=row.max_input_length, truncate=True,
                             on_batch=on_batch)
            c = costs["c"]
            # The theory takes the per-token α (paper section 3.1), estimated from tokens per call.
            alpha = alpha_from_tokens_per_call(m.tokens_per_target_call, gamma)
            w = costs["window_over_step"][gamma]
            expected = expected_improvement(alpha, gamma, c)
            rec = {
                "task": row.task, "target": row.target, "draft": row.draft, "temperature": row.temperature,
                "gamma": gamma, "batch_size": bs, "num_inputs": len(ids), "repeats": repeats,
                "max_decode_length": row.max_decode_length, "alpha": m.acceptance_rate,
                "alpha_per_token": alpha,
                "alpha_rows": [float(a) for a in m.row_acceptance_rates],
                "tokens_per_call": m.tokens_per_target_call,
                "expected_tokens_per_call": expected_tokens_per_call(alpha, gamma),
                "c": c, "draft_step_ms": costs["draft_step_s"] * 1e3, "target_step_ms": costs["target_step_s"] * 1e3,
                "target_window_ms": costs["target_window_s"][gamma] * 1e3, "window_over_step": w,
                "expected_improvement": expected,
                "expected_improvement_window": expected_tokens_per_call(alpha, gamma) / (gamma * c + w),
                "speedup": m.speedup, "speedup_over_expected": m.speedup / expected,
                "spec_seconds": m.spec_seconds, "base_seconds": m.base_seconds,
                "spec_compile_seconds": m.spec_compile_seconds, "base_compile_seconds": m.base_compile_seconds,
                "spec_tokens_per_s": m.output_tokens * repeats / m.spec_seconds,
                "base_tokens_per_s": m.base_output_tokens * repeats / m.base_seconds,
                "iteration_ms": m.spec_seconds / max(1, repeats * m.spec_iterations) * 1e3,
                "greedy_identical": (all(np.array_equal(a, b) for a, b in zip(m.sequences("spec"), m.sequences("base")))
                                     if row.temperature == 0 else None),
                "paper_alpha": row.paper_alpha, "paper_speedup": row.paper_speedup, **env,
            }
            if refs is not None:
                for which in ("spec", "base"):
                    hyps = [tokenizer.decode(s) for s in m.sequences(which)]
                    rec[f"quality_{which}"] = quality(hyps, refs, row.metric)
            records.append(rec)
    return records


# ----------------------------------------------------------------------------------------------------------
# Tables, plots, goals

TABLE_COLUMNS = [
    # (key, header, format) -- the first six are the paper's Table 2 layout.
    ("task", "task", "{}"), ("draft", "draft", "{}"), ("temperature", "temp", "{:g}"), ("gamma", "γ", "{}"),
    ("alpha_per_token", "α", "{:.3f}"), ("speedup", "speedup", "{:.2f}x"),
    ("alpha", "accepted/drafted", "{:.3f}"),
    ("paper_alpha", "paper α", "{:.2f}"), ("paper_speedup", "paper speedup", "{:.1f}x"),
    ("expected_improvement", "expected (theory)", "{:.2f}x"), ("speedup_over_expected", "measured/expected", "{:.2f}"),
    ("c", "c", "{:.3f}"), ("window_over_step", "window/step", "{:.2f}"),
    ("tokens_per_call", "tokens/call", "{:.2f}"), ("expected_tokens_per_call", "expected tokens/call", "{:.2f}"),
    ("batch_size", "batch", "{}"), ("target", "target", "{}"), ("num_inputs", "inputs", "{}"),
    ("spec_tokens_per_s", "spec tok/s", "{:.1f}"), ("base_tokens_per_s", "base tok/s", "{:.1f}"),
    ("spec_compile_seconds", "spec compile s", "{:.1f}"), ("base_compile_seconds", "base compile s", "{:.1f}"),
]


def _quality_text(rec: dict, which: str) -> str:
    q = rec.get(f"quality_{which}") or {}
    return " ".join(f"{k}={v:.1f}" for k, v in q.items() if isinstance(v, float))


def _cell(rec: dict, key: str, fmt: str) -> str:
    v = rec.get(key)
    if v is None:
        return ""
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def format_markdown(records: Sequence[dict]) -> str:
    """The records as a Markdown table: the paper's Table 2 columns (task, draft, temp, γ, α, speedup) first,
    then the paper's numbers, theory, c, tokens per call, throughput, compile times and quality, then one
    line with the environment (jax version, backend, device kind and count)."""
    has_q = any(r.get("quality_spec") for r in records)
    heads = [h for _, h, _ in TABLE_COLUMNS] + (["quality (spec)", "quality (base)"] if has_q else [])
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in records:
        cells = [_cell(r, k, f) for k, _, f in TABLE_COLUMNS]
        if has_q:
            cells += [_quality_text(r, "spec"), _quality_text(r, "base")]
        lines.append("| " + " | ".join(cells) + " |")
    if records:
        e = records[0]
        lines.append("")
        lines.append(f"jax {e['jax']}, backend {e['backend']}, {e['device_count']} x {e['device_kind']}; "
                     "speedup = temperature_sample time / speculative_sample time on the same inputs, after "
                     "compilation; expected = (1 − α^(γ+1)) / ((1 − α)(γc + 1)) with the measured α and c.")
    return "\n".join(lines) + "\n"


CSV_COLUMNS = [k for k, _, _ in TABLE_COLUMNS] + [
    "expected_improvement_window", "draft_step_ms", "target_step_ms", "target_window_ms", "iteration_ms",
    "spec_seconds", "base_seconds", "repeats", "max_decode_length", "greedy_identical", "quality_spec",
    "quality_base", "jax", "backend", "device_kind", "device_count"]


def write_csv(records: Sequence[dict], path: str) -> None:
    """One CSV line per record, columns ``CSV_COLUMNS`` (quality as ``name=value`` pairs; per-row α is in the
    JSON only)."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in records:
            w.writerow([_quality_text(r, k[len("quality_"):]) if k.startswith("quality_")
                        else ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS])


def plot_records(records: Sequence[dict], out_dir: str) -> list[str]:
    """Two PNGs (matplotlib, Agg): ``alpha_vs_gamma.png`` (α measured per γ, with the paper's α, and tokens
    per target call measured next to (1 − α^(γ+1)) / (1 − α)) and ``speedup_vs_gamma.png`` (measured speedup
    next to the theory curve at the measured α and c, and the paper's speedup). One series per
    (task, draft, temperature, batch size). Returns the paths written."""
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple, list[dict]] = {}
    for r in records:
        series.setdefault((r["task"], r["draft"], r["temperature"], r["batch_size"]), []).append(r)
    paths = []
    fig, (ax_a, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2))
    fig2, ax_s = plt.subplots(figsize=(6.5, 4.2))
    for i, (key, rs) in enumerate(sorted(series.items(), key=lambda kv: str(kv[0]))):
        rs = sorted(rs, key=lambda r: r["gamma"])
        color = f"C{i % 10}"
        label = f"{key[0]} {key[1]} T={key[2]:g}" + (f" b={key[3]}" if key[3] != 1 else "")
        g = [r["gamma"] for r in rs]
        ax_a.plot(g, [r["alpha_per_token"] for r in rs], "o-", color=color, label=label)
        ax_t.plot(g, [r["tokens_per_call"] for r in rs], "o-", color=color, label=f"{label} measured")
        ax_t.plot(g, [r["expected_tokens_per_call"] for r in rs], "x--", color=color, label=f"{label} theory")
        ax_s.plot(g, [r["speedup"] for r in rs], "o-", color=color, label=f"{label} measured")
        # Theory at the mean measured α and c over this series, on a dense γ grid.
        alpha = float(np.mean([r["alpha_per_token"] for r in rs]))
        c = float(np.mean([r["c"] for r in rs]))
        dense = np.arange(1, max(max(g), 1) + 1)
        ax_s.plot(dense, [expected_improvement(alpha, int(x), c) for x in dense], "--", color=color,
                  label=f"{label} theory (α={alpha:.2f}, c={c:.3f})")
        for r in rs:
            if r.get("paper_alpha") is not None:
                ax_a.plot([r["gamma"]], [r["paper_alpha"]], "*", color=color, markersize=12)
            if r.get("paper_speedup") is not None:
                ax_s.plot([r["gamma"]], [r["paper_speedup"]], "*", color=color, markersize=12)
    ax_a.set(xlabel="γ (draft tokens per target call)", ylabel="per-token acceptance rate α (from tokens/call)", title="α (★ = paper)",
             ylim=(0, 1.02))
    ax_t.set(xlabel="γ", ylabel="tokens per target call", title="tokens per target call: measured vs theory")
    ax_s.axhline(1.0, color="grey", lw=0.8)
    ax_s.set(xlabel="γ (draft tokens per target call)", ylabel="walltime speedup",
             title="speedup over temperature_sample (★ = paper)")
    from matplotlib.ticker import MaxNLocator

    for ax in (ax_a, ax_t, ax_s):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    if records:
        e = records[0]
        fig.suptitle(f"jax {e['jax']}, {e['backend']} {e['device_count']}x {e['device_kind']}", fontsize=8)
        fig2.suptitle(f"jax {e['jax']}, {e['backend']} {e['device_count']}x {e['device_kind']}", fontsize=8)
    for f, name in ((fig, "alpha_vs_gamma.png"), (fig2, "speedup_vs_gamma.png")):
        f.tight_layout()
        path = os.path.join(out_dir, name)
        f.savefig(path, dpi=120)
        plt.close(f)
        paths.append(path)
    return paths


GOALS = {
    "speedup_t0_b1": ("speculative / temperature_sample speedup (T=0, batch 1, best γ)", 1.5),
    "measured_over_expected": ("measured / paper-expected speedup (same row)", 0.85),
    "specjax_vs_hf_assisted": ("specjax speculative vs transformers assisted (T=0, batch 1)", 3.0),
    "batch16_over_batch1": ("speculative throughput batch 16 / batch 1 (T=0, same γ)", 6.0),
}


def goal_ratios(records: Sequence[dict], hf: dict | None = None, scaling: Sequence[dict] | None = None) -> dict:
    """The ratios the project's goals are stated in (see ``GOALS``), from bench records, an optional
    ``specjax.hf_compare.compare_with_transformers`` result and optional ``batch_scaling`` records (which
    take precedence for the batch ratio). Missing inputs give no entry.

    Returns:
      dict goal key -> {"value", "goal", "what", "where"}.
    """
    out = {}
    t0b1 = [r for r in records if r["temperature"] == 0 and r["batch_size"] == 1]
    if t0b1:
        best = max(t0b1, key=lambda r: r["speedup"])
        where = f"{best['task']} {best['draft']} γ={best['gamma']}"
        out["speedup_t0_b1"] = {"value": best["speedup"], "where": where}
        out["measured_over_expected"] = {"value": best["speedup_over_expected"], "where": where}
    if hf and hf.get("greedy"):
        out["specjax_vs_hf_assisted"] = {"value": hf["greedy"]["hf_assisted_over_specjax_spec"],
                                         "where": f"γ={hf['gamma']}, {hf['num_inputs']} inputs"}
    by = {}
    for r in records:
        if r["temperature"] == 0:
            by.setdefault((r["task"], r["draft"], r["gamma"]), {})[r["batch_size"]] = r["spec_tokens_per_s"]
    ratios = [(v[16] / v[1], k) for k, v in by.items() if 1 in v and 16 in v]
    if ratios:
        value, k = max(ratios)
        out["batch16_over_batch1"] = {"value": value, "where": f"{k[0]} {k[1]} γ={k[2]}"}
    by_bs = {r["batch_size"]: r for r in scaling or []}
    if 1 in by_bs and 16 in by_bs:
        out["batch16_over_batch1"] = {
            "value": by_bs[16]["specjax_spec_tokens_per_s"] / by_bs[1]["specjax_spec_tokens_per_s"],
            "where": f"batch scaling, γ={by_bs[1]['gamma']}, {by_bs[1]['num_inputs']} inputs"}
    for key, d in out.items():
        d["what"], d["goal"] = GOALS[key]
    return out


def format_goals(goals: dict) -> str:
    """Text lines: each goal ratio, its goal and whether it is met."""
    lines = ["goals (ratios measured in this run):"]
    for key in GOALS:
        if key in goals:
            g = goals[key]
            ok = "met" if g["value"] >= g["goal"] else "NOT met"
            lines.append(f"  {g['what']:<66} {g['value']:6.2f}  (goal >= {g['goal']:g}: {ok}; {g['where']})")
    return "\n".join(lines)

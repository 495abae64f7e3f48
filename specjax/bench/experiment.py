"""Experiments: rows of a Table-2 style run (``configs/*.json``), each measured at its γ values and batch sizes.

A row is a task (inputs, references, metric), a target/draft pair and a temperature (Leviathan et al. 2023,
Table 2 layout), plus the drafting variants to sweep: verification ("token" / "block"), the draft confidence
threshold, or prompt-lookup drafting in place of a draft model (``draft == PROMPT_LOOKUP``). ``run_row``
measures it with ``timing.measure_pair`` (batch 1: the paper's setting, one call per input) or
``timing.measure_bulk_pair`` (batch size > 1: ``specjax generate``'s bulk path, slots refilled as lines finish)
and ``timing.measure_costs``, and puts the paper's theory (``theory``) beside the measurement, one record (a dict)
per (batch size, verification, threshold, γ).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from specjax.bench.inputs import encode_inputs, pad_batches, read_lines
from specjax.bench.theory import alpha_from_tokens_per_call, expected_improvement, expected_tokens_per_call
from specjax.bench.timing import environment, measure_bulk_pair, measure_costs, measure_pair
from specjax.tokenizer import as_tokenizer

__all__ = ["PROMPT_LOOKUP", "VERIFICATIONS", "BenchRow", "load_experiment", "quality", "run_row"]

# The draft name and path that mean prompt-lookup (n-gram) drafting, no draft model (specjax.PromptLookupDraft).
PROMPT_LOOKUP = "prompt-lookup"
VERIFICATIONS = ("token", "block")


@dataclasses.dataclass(frozen=True)
class BenchRow:
    """One row of an experiment: a task, a target/draft pair, a temperature and the γ values to run.

    Attributes:
      task: task name as printed ("EnDe", "CNNDM", "multi30k" …).
      target, draft: model names as printed (keys of the experiment's ``models``).
      target_path, draft_path: checkpoint paths (local, ``gs://``) or ``default:target``,
        ``default:distilled``, ``default:reference`` for the shipped pair of the default size, or
        ``default:mini:target``, ``default:small:distilled``, ... for a named size.
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
      verifications: verifiers to sweep, each "token" (Algorithm 1) or "block" (Sun et al. 2025).
      confidence_thresholds: draft confidence thresholds to sweep, each None (off: always γ draft tokens) or a
        probability in [0, 1] (a row stops drafting after a draft token less likely than it; draft models only).
      max_ngram: the longest n-gram matched when ``draft_path == PROMPT_LOOKUP`` (tokens, >= 1).
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
    verifications: tuple[str, ...] = ("token",)
    confidence_thresholds: tuple[float | None, ...] = (None,)
    max_ngram: int = 3


_TASK_KEYS = {
    "input",
    "references",
    "prefix",
    "metric",
    "max_input_length",
    "max_decode_length",
    "num_inputs",
    "tokenizer",
}
_ROW_KEYS = {
    "task",
    "target",
    "draft",
    "temperature",
    "gamma",
    "paper",
    "verification",
    "draft_confidence_threshold",
    "max_ngram",
}


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _row_variants(r: dict, where: str, lookup: bool) -> dict:
    """The drafting-variant fields of one experiment-file row (``verification``, ``draft_confidence_threshold``,
    ``max_ngram``) as ``BenchRow`` keywords. Raises ValueError naming the row on a bad value or combination."""
    import numbers

    verifications = _as_list(r.get("verification", "token"))
    bad = [v for v in verifications if v not in VERIFICATIONS]
    if bad or not verifications:
        raise ValueError(
            f"{where}: verification must be one of {list(VERIFICATIONS)} or a list of them, got "
            f"{r.get('verification')!r}."
        )
    thresholds = _as_list(r.get("draft_confidence_threshold"))
    for c in thresholds:
        if c is not None and (isinstance(c, bool) or not isinstance(c, numbers.Real) or not 0.0 <= c <= 1.0):
            raise ValueError(
                f"{where}: draft_confidence_threshold must be null or a number in [0, 1] (or a list "
                f"of them), got {c!r}."
            )
    if not thresholds:
        raise ValueError(f"{where}: draft_confidence_threshold is an empty list; use null for off.")
    if lookup and any(c is not None for c in thresholds):
        raise ValueError(
            f"{where}: draft_confidence_threshold needs a draft model; a prompt-lookup proposal has "
            "no confidence (drop one of the two)."
        )
    n = r.get("max_ngram", 3)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{where}: max_ngram must be an int >= 1, got {n!r}.")
    return dict(
        verifications=tuple(verifications),
        confidence_thresholds=tuple(None if c is None else float(c) for c in thresholds),
        max_ngram=n,
    )


def load_experiment(path: str) -> tuple[dict, list[BenchRow]]:
    """Reads an experiment file (``configs/paper_table2.json`` layout, see ``configs/README.md``).

    Returns:
      (the file's top-level metadata without ``rows``, the expanded ``BenchRow`` list in file order).
    Raises:
      FileNotFoundError: no such file. ValueError: malformed JSON, a row naming an unknown model or task,
        unknown keys, a missing field, a bad verification / draft_confidence_threshold / max_ngram, or a
        confidence threshold on a prompt-lookup row (the message names the row).
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
        unknown = set(r) - _ROW_KEYS
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}.")
        for key in ("task", "target", "draft", "temperature", "gamma"):
            if key not in r:
                raise ValueError(f"{where}: missing {key!r}.")
        if r["task"] not in tasks:
            raise ValueError(f"{where}: task {r['task']!r} is not in the file's tasks {sorted(tasks)}.")
        for key in ("target", "draft"):
            if r[key] not in models and not (key == "draft" and r[key] == PROMPT_LOOKUP):
                raise ValueError(f"{where}: {key} {r[key]!r} is not in the file's models {sorted(models)}.")
        task = dict(tasks[r["task"]])
        bad = set(task) - _TASK_KEYS
        if bad:
            raise ValueError(f"{path}: task {r['task']!r} has unknown keys {sorted(bad)}.")
        task.setdefault("tokenizer", spec.get("tokenizer", "default"))
        gammas = r["gamma"] if isinstance(r["gamma"], list) else [r["gamma"]]
        paper = r.get("paper") or {}
        draft_path = PROMPT_LOOKUP if r["draft"] == PROMPT_LOOKUP else models[r["draft"]]
        variants = _row_variants(r, where, lookup=draft_path == PROMPT_LOOKUP)
        rows.append(
            BenchRow(
                task=r["task"],
                target=r["target"],
                draft=r["draft"],
                target_path=models[r["target"]],
                draft_path=draft_path,
                temperature=float(r["temperature"]),
                gammas=tuple(int(g) for g in gammas),
                paper_alpha=paper.get("alpha"),
                paper_speedup=paper.get("speedup"),
                **variants,
                **task,
            )
        )
    if not rows:
        raise ValueError(f"{path}: no rows.")
    meta = {k: v for k, v in spec.items() if k != "rows"}
    return meta, rows


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


def run_row(
    target,
    draft,
    tokenizer,
    row: BenchRow,
    *,
    batch_sizes: Sequence[int] = (1,),
    repeats: int = 1,
    seed: int = 0,
    cost_steps: int = 32,
    with_quality: bool = True,
    on_batch: Callable[[], None] | None = None,
    auto: bool = False,
) -> list[dict]:
    """Measures one ``BenchRow`` at each batch size, verification, confidence threshold and γ: one record each.

    Both methods run on the same inputs in the same process, alternating: at batch 1 call by call
    (``measure_pair``), at a batch size > 1 as bulk decodes through that many slots, whole passes alternating
    (``measure_bulk_pair``: the target alone through the same slots is the baseline); c is measured
    at each batch size (``measure_costs``); the theory takes the paper's α as measured inside the loop
    (``DecodeResult.acceptance_rate``, the mean of β over verified positions), or, for results without it,
    α inverted from tokens per target call (``alpha_source`` says which).

    Args:
      target: a ``T5Model``. draft: a ``T5Model``, or a draft source such as ``specjax.PromptLookupDraft``
        (no draft model: c is 0 and ``draft_step_ms`` None; ``row.confidence_thresholds`` must be ``(None,)``).
      tokenizer: a ``specjax.Tokenizer``, a ``seqio.SentencePieceVocabulary`` or a model path.
      batch_sizes: rows per decode call; repeats: passes over the inputs per measurement; seed: batch ``j``
        uses ``PRNGKey(seed + j)``; cost_steps: decode calls per timing loop for c; with_quality: BLEU/ROUGE
        when the row has references; on_batch: called after each measured batch (progress bars); auto: also
        one record per batch size with ``gamma`` "auto" (``specjax.Decoder``: γ chosen per call, 0 the target
        alone; ``gammas_run`` the γ of each batch; the theory and cost columns None), draft models only.
    Returns:
      list of dicts with: task, target, draft, temperature, gamma, verification, confidence_threshold (None =
      off), max_ngram (prompt lookup, else None), batch_size, num_inputs, repeats, max_decode_length;
      alpha (the paper's α used by the theory), alpha_source ("loop" or "tokens_per_call"), alpha_loop
      (in-loop α or None), alpha_from_tokens (α inverted from tokens per call), alpha_rows (α per input, or
      accepted fraction per input when the loop's α is missing), accepted_fraction
      (accepted / drafted), accepted_per_position (γ counts or None), mean_accepted_length (accepted per
      iteration), tokens_per_call, expected_tokens_per_call, c, draft_step_ms, target_step_ms,
      target_window_ms, window_over_step, expected_improvement (paper), expected_improvement_window
      (tokens / (γc + window/step)), speedup (measured), speedup_over_expected, spec_seconds, base_seconds,
      spec_compile_seconds, base_compile_seconds (seconds), spec_tokens_per_s, base_tokens_per_s,
      iteration_ms, greedy_identical (temperature 0: speculative == temperature_sample token for token),
      quality_spec / quality_base, paper_alpha, paper_speedup, and ``environment()``.
    Raises:
      FileNotFoundError: missing input or reference file. ValueError: as ``measure_pair`` (an unknown
        verification, a confidence threshold with a draft source that has no confidence …).
    """
    tokenizer = as_tokenizer(tokenizer)  # also a seqio.SentencePieceVocabulary or a model path
    lines = read_lines(row.input, row.num_inputs)
    if not lines:
        raise ValueError(f"{row.input} has no lines.")
    refs = read_lines(row.references, row.num_inputs) if (row.references and with_quality and row.metric) else None
    ids = encode_inputs(tokenizer, lines, row.prefix, row.max_input_length)
    env = environment()
    draft_model = None if (hasattr(draft, "propose") and hasattr(draft, "start")) else draft  # else a draft source
    variants = [(v, ct, g) for v in row.verifications for ct in row.confidence_thresholds for g in row.gammas]
    records = []
    for bs in batch_sizes:
        batches = pad_batches(ids, batch_size=bs, pad_id=target.config.pad_id)
        costs = measure_costs(target, draft_model, batches[0], row.gammas, steps=cost_steps)
        for verification, threshold, gamma in variants:
            common = dict(
                gamma=gamma,
                temperature=row.temperature,
                max_decode_length=row.max_decode_length,
                seed=seed,
                repeats=repeats,
                max_input_length=row.max_input_length,
                truncate=True,
                verification=verification,
                draft_confidence_threshold=threshold,
                on_batch=on_batch,
            )
            if bs > 1:  # what a file gets: slots refilled as lines finish (specjax generate's bulk path)
                m = measure_bulk_pair(target, draft, ids, batch_size=bs, **common)
            else:
                m = measure_pair(target, draft, batches, num_inputs=len(ids), **common)
            c = costs["c"]
            alpha_tokens = alpha_from_tokens_per_call(m.tokens_per_target_call, gamma)
            alpha_loop = m.acceptance_rate
            alpha = alpha_loop if alpha_loop is not None else alpha_tokens
            row_alpha = m.row_acceptance_rates
            w = costs["window_over_step"][gamma]
            expected = expected_improvement(alpha, gamma, c)
            rec = {
                "task": row.task,
                "target": row.target,
                "draft": row.draft,
                "temperature": row.temperature,
                "gamma": gamma,
                "verification": verification,
                "confidence_threshold": threshold,
                "max_ngram": getattr(draft, "max_ngram", None) if draft_model is None else None,
                "batch_size": bs,
                "num_inputs": len(ids),
                "repeats": repeats,
                "max_decode_length": row.max_decode_length,
                "alpha": alpha,
                "alpha_source": "loop" if alpha_loop is not None else "tokens_per_call",
                "alpha_loop": alpha_loop,
                "alpha_from_tokens": alpha_tokens,
                "alpha_rows": [float(a) for a in (row_alpha if row_alpha is not None else m.row_accepted_fractions)],
                "accepted_fraction": m.accepted_fraction,
                "accepted_per_position": m.accepted_per_position,
                "mean_accepted_length": m.mean_accepted_length,
                "tokens_per_call": m.tokens_per_target_call,
                "expected_tokens_per_call": expected_tokens_per_call(alpha, gamma),
                "c": c,
                "draft_step_ms": None if costs["draft_step_s"] is None else costs["draft_step_s"] * 1e3,
                "target_step_ms": costs["target_step_s"] * 1e3,
                "target_window_ms": costs["target_window_s"][gamma] * 1e3,
                "window_over_step": w,
                "expected_improvement": expected,
                "expected_improvement_window": expected_tokens_per_call(alpha, gamma) / (gamma * c + w),
                "speedup": m.speedup,
                "speedup_over_expected": m.speedup / expected,
                "spec_seconds": m.spec_seconds,
                "base_seconds": m.base_seconds,
                "spec_compile_seconds": m.spec_compile_seconds,
                "base_compile_seconds": m.base_compile_seconds,
                "spec_tokens_per_s": m.output_tokens * repeats / m.spec_seconds,
                "base_tokens_per_s": m.base_output_tokens * repeats / m.base_seconds,
                "iteration_ms": m.spec_seconds / max(1, repeats * m.spec_iterations) * 1e3,
                "greedy_identical": (
                    all(np.array_equal(a, b) for a, b in zip(m.sequences("spec"), m.sequences("base")))
                    if row.temperature == 0
                    else None
                ),
                "paper_alpha": row.paper_alpha,
                "paper_speedup": row.paper_speedup,
                **env,
            }
            if refs is not None:
                for which in ("spec", "base"):
                    hyps = [tokenizer.decode(s) for s in m.sequences(which)]
                    rec[f"quality_{which}"] = quality(hyps, refs, row.metric)
            records.append(rec)
        if auto and draft_model is not None:
            records.append(_auto_record(target, draft, batches, ids, row, bs, seed, repeats, on_batch, env))
    return records


def _auto_record(target, draft, batches, ids, row: BenchRow, bs: int, seed: int, repeats: int, on_batch, env):
    """One ``run_row`` record for ``gamma="auto"`` (see ``run_row``)."""
    n = len(ids)
    common = dict(
        gamma="auto",
        temperature=row.temperature,
        max_decode_length=row.max_decode_length,
        seed=seed,
        repeats=repeats,
        max_input_length=row.max_input_length,
        truncate=True,
        on_batch=on_batch,
    )
    if bs > 1:  # slots refilled as lines finish, γ chosen per run of the slot loop
        m = measure_bulk_pair(target, draft, ids, batch_size=bs, **common)
    else:
        m = measure_pair(target, draft, batches, num_inputs=n, **common)
    speculative = any(g > 0 for g in m.gammas)
    return {
        "task": row.task,
        "target": row.target,
        "draft": row.draft,
        "temperature": row.temperature,
        "gamma": "auto",
        "gammas_run": list(m.gammas),
        "verification": "token",
        "confidence_threshold": None,
        "max_ngram": None,
        "batch_size": bs,
        "num_inputs": n,
        "repeats": repeats,
        "max_decode_length": row.max_decode_length,
        "alpha": m.acceptance_rate if speculative else None,
        "alpha_source": "loop" if speculative else None,
        "accepted_fraction": m.accepted_fraction if speculative else None,
        "tokens_per_call": m.tokens_per_target_call,
        "speedup": m.speedup,
        "spec_seconds": m.spec_seconds,
        "base_seconds": m.base_seconds,
        "spec_compile_seconds": m.spec_compile_seconds,
        "base_compile_seconds": m.base_compile_seconds,
        "spec_tokens_per_s": m.output_tokens * repeats / m.spec_seconds,
        "base_tokens_per_s": m.base_output_tokens * repeats / m.base_seconds,
        "greedy_identical": (
            all(np.array_equal(a, b) for a, b in zip(m.sequences("spec"), m.sequences("base")))
            if row.temperature == 0
            else None
        ),
        "paper_alpha": row.paper_alpha,
        "paper_speedup": row.paper_speedup,
        **env,
    }

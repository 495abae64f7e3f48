"""Experiments: rows of a Table-2 style run (``configs/*.json``), each measured at its γ values and batch sizes.

A row is a task (inputs, references, metric), a target/draft pair and a temperature (Leviathan et al. 2023,
Table 2 layout). ``run_row`` measures it with ``timing.measure_pair`` and ``timing.measure_costs`` and puts the
paper's theory (``theory``) beside the measurement, one record (a dict) per (γ, batch size).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from specjax.bench.inputs import encode_inputs, pad_batches, read_lines
from specjax.bench.theory import alpha_from_tokens_per_call, expected_improvement, expected_tokens_per_call
from specjax.bench.timing import environment, measure_costs, measure_pair

__all__ = ["BenchRow", "load_experiment", "quality", "run_row"]


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


def run_row(target, draft, tokenizer, row: BenchRow, *, batch_sizes: Sequence[int] = (1,), repeats: int = 1,
            seed: int = 0, cost_steps: int = 32, with_quality: bool = True,
            on_batch: Callable[[], None] | None = None) -> list[dict]:
    """Measures one ``BenchRow`` at each of its γ and each batch size: one record per (γ, batch size).

    Both methods run on the same inputs in the same process, alternating (``measure_pair``); c is measured
    at each batch size (``measure_costs``); the theory takes the paper's α as measured inside the loop
    (``DecodeResult.acceptance_rate``, the mean of β over verified positions), or, for results without it,
    α inverted from tokens per target call (``alpha_source`` says which).

    Returns:
      list of dicts with: task, target, draft, temperature, gamma, batch_size, num_inputs, repeats,
      max_decode_length; alpha (the paper's α used by the theory), alpha_source ("loop" or "tokens_per_call"),
      alpha_loop (in-loop α or None), alpha_from_tokens (α inverted from tokens per call), alpha_rows (α per
      input, or accepted fraction per input when the loop's α is missing), accepted_fraction
      (accepted / drafted), accepted_per_position (γ counts or None), mean_accepted_length (accepted per
      iteration), tokens_per_call, expected_tokens_per_call, c, draft_step_ms, target_step_ms,
      target_window_ms, window_over_step, expected_improvement (paper), expected_improvement_window
      (tokens / (γc + window/step)), speedup (measured), speedup_over_expected, spec_seconds, base_seconds,
      spec_compile_seconds, base_compile_seconds (seconds), spec_tokens_per_s, base_tokens_per_s,
      iteration_ms, greedy_identical (temperature 0: speculative == temperature_sample token for token),
      quality_spec / quality_base, paper_alpha, paper_speedup, and ``environment()``.
    Raises:
      FileNotFoundError: missing input or reference file. ValueError: as ``measure_pair``.
    """
    from specjax.tokenizer import as_tokenizer
    tokenizer = as_tokenizer(tokenizer)  # also a seqio.SentencePieceVocabulary or a model path
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
            alpha_tokens = alpha_from_tokens_per_call(m.tokens_per_target_call, gamma)
            alpha_loop = m.acceptance_rate
            alpha = alpha_loop if alpha_loop is not None else alpha_tokens
            row_alpha = m.row_acceptance_rates
            w = costs["window_over_step"][gamma]
            expected = expected_improvement(alpha, gamma, c)
            rec = {
                "task": row.task, "target": row.target, "draft": row.draft, "temperature": row.temperature,
                "gamma": gamma, "batch_size": bs, "num_inputs": len(ids), "repeats": repeats,
                "max_decode_length": row.max_decode_length,
                "alpha": alpha, "alpha_source": "loop" if alpha_loop is not None else "tokens_per_call",
                "alpha_loop": alpha_loop, "alpha_from_tokens": alpha_tokens,
                "alpha_rows": [float(a) for a in (row_alpha if row_alpha is not None else m.row_accepted_fractions)],
                "accepted_fraction": m.accepted_fraction, "accepted_per_position": m.accepted_per_position,
                "mean_accepted_length": m.mean_accepted_length,
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

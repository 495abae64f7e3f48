"""Measuring speculative sampling: theory, side-by-side timing, profiles, reports and peers.

Each concern lives in its own module:

  theory.py      the paper's formulas (Leviathan et al. 2023, §3.1, Theorem 3.8); α from tokens per call
  inputs.py      text files -> token ids -> fixed-shape batches; the Multi30k test set's path
  timing.py      speculative_sample vs temperature_sample on the same inputs, alternating (measure_pair);
                 bulk decodes through slots at γ vs the target alone, whole passes (measure_bulk_pair);
                 the cost ratio c (measure_cost_ratio, measure_costs)
  experiment.py  Table-2 style rows from configs/*.json (BenchRow, load_experiment), run_row, BLEU/ROUGE;
                 drafting variants per row: token / block verification, confidence threshold, prompt lookup
  report.py      Markdown / CSV tables and the α / speedup plots of run_row's records
  profile.py     a jax.profiler trace of the real compiled decode, read back per named scope and per
                 iteration, beside this machine's limits (profile_decode, format_profile)
  peers/         Hugging Face transformers (hf.py) and CTranslate2 (ct2.py) on the same weights and inputs
  invariance.py  a verification window's logits against the target alone's steps (window_step_mismatch)

The names below are re-exported for convenience (``from specjax import bench; bench.measure_pair(...)``).
"""

from specjax.bench.experiment import PROMPT_LOOKUP, VERIFICATIONS, BenchRow, load_experiment, quality, run_row
from specjax.bench.inputs import MULTI30K_TEST, encode_inputs, pad_batches, read_lines
from specjax.bench.report import CSV_COLUMNS, TABLE_COLUMNS, VARIANT_COLUMNS, format_markdown, plot_records, write_csv
from specjax.bench.theory import alpha_from_tokens_per_call, expected_improvement, expected_tokens_per_call
from specjax.bench.timing import (
    BulkPairMeasurement,
    PairMeasurement,
    environment,
    finish,
    measure_bulk_pair,
    measure_cost_ratio,
    measure_costs,
    measure_pair,
)

__all__ = [
    "expected_tokens_per_call",
    "expected_improvement",
    "alpha_from_tokens_per_call",
    "MULTI30K_TEST",
    "read_lines",
    "encode_inputs",
    "pad_batches",
    "environment",
    "finish",
    "PairMeasurement",
    "measure_pair",
    "BulkPairMeasurement",
    "measure_bulk_pair",
    "measure_cost_ratio",
    "measure_costs",
    "PROMPT_LOOKUP",
    "VERIFICATIONS",
    "BenchRow",
    "load_experiment",
    "quality",
    "run_row",
    "TABLE_COLUMNS",
    "VARIANT_COLUMNS",
    "CSV_COLUMNS",
    "format_markdown",
    "write_csv",
    "plot_records",
]

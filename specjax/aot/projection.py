"""The paper's speedup formula with the verification window's cost folded in, and the paper's Table 2 rows it
projects (Leviathan, Kalman & Matias 2023, section 3 and Tables 2 and 4).
"""

from __future__ import annotations

import json
import os
import sys

PAPER_C = {"t5_1_1_small": 0.02, "t5_1_1_base": 0.04, "t5_1_1_large": 0.11}
"""c = draft step / target step that Leviathan et al. 2023 report for T5 1.1 drafts of a T5-XXL target (their
Table 4, TPU-v4), keyed by preset."""

_PAPER_DRAFTS = {"T5-small": "t5_1_1_small", "T5-base": "t5_1_1_base", "T5-large": "t5_1_1_large"}
_PAPER_TABLE2 = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "paper_table2.json"
)


def expected_speedup(alpha: float, gamma: int, c: float, window: float = 1.0) -> float:
    """Expected walltime improvement of speculative decoding over the target alone (Leviathan et al. 2023, §3:
    ``(1 - α^(γ+1)) / ((1 - α)(γc + 1))``), with the verification window's cost ``window`` (in target steps)
    in place of the paper's 1: ``(1 - α^(γ+1)) / ((1 - α)(γc + window))``. α = 1 gives ``(γ+1) / (γc + window)``."""
    tokens = gamma + 1 if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
    return tokens / (gamma * c + window)


def _paper_rows(path: str | None) -> list[dict]:
    """The paper's Table 2 rows (``configs/paper_table2.json`` of a checkout, or ``path``); [] with a warning on
    stderr when the file is absent (an installed wheel has no ``configs/``) or unreadable."""
    try:
        with open(path or _PAPER_TABLE2) as f:
            return json.load(f)["rows"]
    except (OSError, KeyError, ValueError) as e:
        print(
            f"specjax aot: no Table 2 projections: cannot read the paper's rows from {path or _PAPER_TABLE2} ({e}); "
            "run from a checkout or pass the file of configs/paper_table2.json (compile_report(paper_table=...)).",
            file=sys.stderr,
        )
        return []


def _summarise(report: dict, paper_rows: list[dict]) -> None:
    """Adds ``c``, ``window_over_step`` and ``projections`` from the pieces' ``estimate_seconds`` (HBM traffic
    read from the HLO, or the MXU time if larger), and the same from XLA's raw cost model (``cost_model_seconds``)
    as ``c_cost_model``, ``window_over_step_cost_model`` and each projection's ``projected_speedup_cost_model``."""
    pieces = report["pieces"]
    by_gamma = report.pop("window_over_step_by_gamma", {}) or {}
    for key, suffix in (("estimate_seconds", ""), ("cost_model_seconds", "_cost_model")):
        step = pieces.get("target_step", {}).get(key)
        draft = pieces.get("draft_step", {}).get(key)
        window = pieces.get("target_window", {}).get(key)
        report["c" + suffix] = draft / step if step and draft else None
        report["window_over_step" + suffix] = window / step if step and window else None
        report["window_over_step_by_gamma" + suffix] = by_gamma.get(key, {})
    report["paper_c"] = PAPER_C.get(report["draft"])
    projections = []
    for row in paper_rows:
        if _PAPER_DRAFTS.get(row["draft"]) != report["draft"] or report["c"] is None:
            continue
        alpha, g = row["paper"]["alpha"], row["gamma"]
        w = report["window_over_step_by_gamma"].get(str(g), report["window_over_step"])
        w_model = report["window_over_step_by_gamma_cost_model"].get(str(g), report["window_over_step_cost_model"])
        raw = None if report["c_cost_model"] is None else expected_speedup(alpha, g, report["c_cost_model"], w_model)
        projections.append(
            dict(
                task=row["task"],
                draft=row["draft"],
                temperature=row["temperature"],
                gamma=g,
                paper_alpha=alpha,
                paper_speedup=row["paper"]["speedup"],
                paper_expected=(
                    None if report["paper_c"] is None else round(expected_speedup(alpha, g, report["paper_c"]), 3)
                ),
                window_over_step=w,
                projected_speedup=round(expected_speedup(alpha, g, report["c"], w), 3),
                projected_speedup_cost_model=None if raw is None else round(raw, 3),
            )
        )
    report["projections"] = projections

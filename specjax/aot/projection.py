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


MULTI_DRAFT_MEASURED = {
    (0, 2): dict(tokens_ratio=1.134, later_branch=0.139, alpha=0.371),
    (0, 4): dict(tokens_ratio=1.287, later_branch=0.290, alpha=0.373),
    (1, 2): dict(tokens_ratio=1.108, later_branch=0.117, alpha=0.458),
    (1, 4): dict(tokens_ratio=1.229, later_branch=0.214, alpha=0.459),
}
"""Multi-draft verification measured on the shipped small pair (newstest2014, first 200 lines, γ 5, token rule;
``benchmarks/results/multi_draft/2026-12-07_amd-epyc-zen4-avx512bf16.md``), keyed by (temperature, k):
tokens per target call over k = 1 (``tokens_ratio``), the share of target calls that kept a branch other than the
draft's first candidate (``later_branch``), and α of the first candidate."""

MULTI_DRAFT_MODEL = (
    "branch point: k drafts differ only in their first token, so E_k = 1 + a_k (1 - α^γ) / (1 - α) tokens per "
    "target call, with a_k = α + (1 - α) r_k the chance that some branch's first token is accepted and r_k the "
    "share of first-candidate rejections a later candidate recovered, measured on the small pair "
    "(MULTI_DRAFT_MEASURED: r_k = later_branch / (1 - α)) and assumed the same for T5-XXL with a T5 1.1 draft"
)
"""What the k > 1 projections assume (printed with them). On the small pair (γ 5) it gives tokens per call over
k = 1 of 1.131x / 1.285x at temperature 0 for k = 2 / 4 (measured 1.134x / 1.287x) and 1.112x / 1.210x at
temperature 1 (measured 1.108x / 1.229x)."""


def branch_recovery(temperature: float, k: int) -> float:
    """r_k: the share of the draft's first-candidate rejections that one of its next k - 1 candidates recovered,
    measured on the small pair (``MULTI_DRAFT_MEASURED``); 0 for k = 1.

    Raises:
      ValueError: a (temperature, k) never measured (k in 1, 2, 4 at temperature 0 or 1).
    """
    if k == 1:
        return 0.0
    key = (0 if temperature <= 0 else 1, int(k))
    if key not in MULTI_DRAFT_MEASURED or temperature not in (0, 1):
        raise ValueError(f"no measured branch acceptance for k={k} at temperature {temperature:g}: use k in 1, 2, 4.")
    m = MULTI_DRAFT_MEASURED[key]
    return m["later_branch"] / (1.0 - m["alpha"])


def multi_draft_tokens(alpha: float, gamma: int, k: int, temperature: float) -> float:
    """E_k, expected tokens per target call with k drafts whose first tokens differ (``MULTI_DRAFT_MODEL``):
    ``1 + a_k (1 - α^γ) / (1 - α)``, ``a_k = α + (1 - α) r_k``; k = 1 gives the paper's (1 - α^(γ+1)) / (1 - α).

    Raises:
      ValueError: as ``branch_recovery``.
    """
    a = alpha + (1.0 - alpha) * branch_recovery(temperature, k)
    rest = float(gamma) if alpha >= 1.0 else (1.0 - alpha**gamma) / (1.0 - alpha)
    return 1.0 + a * rest


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
    branches = by_gamma.get("branches", {}).get("estimate_seconds", {})
    draft_k = by_gamma.get("draft_k", {}).get("estimate_seconds", {})
    report["window_over_step_branches"] = branches
    report["c_by_num_drafts"] = draft_k
    multi = []
    for row in paper_rows:
        if _PAPER_DRAFTS.get(row["draft"]) != report["draft"]:
            continue
        alpha, g, t = row["paper"]["alpha"], row["gamma"], row["temperature"]
        for k in sorted({int(key.split("_")[0]) for key in branches}):
            w, c = branches.get(f"{k}_{g}"), draft_k.get(str(k))
            if w is None or c is None:
                continue
            one = expected_speedup(alpha, g, report["c"], report["window_over_step_by_gamma"].get(str(g), 1.0))
            tokens = multi_draft_tokens(alpha, g, k, t)
            ratio = MULTI_DRAFT_MEASURED[(0 if t <= 0 else 1, k)]["tokens_ratio"]
            base = (1.0 - alpha ** (g + 1)) / (1.0 - alpha)
            multi.append(
                dict(
                    task=row["task"],
                    draft=row["draft"],
                    temperature=t,
                    gamma=g,
                    num_drafts=k,
                    paper_alpha=alpha,
                    paper_speedup=row["paper"]["speedup"],
                    window_over_step=w,
                    c=c,
                    tokens_per_call=round(tokens, 3),
                    tokens_over_one_draft=round(tokens / base, 3),
                    projected_speedup_one_draft=round(one, 3),
                    projected_speedup=round(tokens / (g * c + w), 3),
                    projected_speedup_ratio_model=round(base * ratio / (g * c + w), 3),
                )
            )
    report["multi_draft_projections"] = multi
    report["multi_draft_model"] = MULTI_DRAFT_MODEL if multi else None

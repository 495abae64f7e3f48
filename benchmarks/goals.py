"""The project's goals (issue 10 "Speed" and earlier ones) as ratios, read from a ``specjax bench`` results.json.

Project bookkeeping, not library code: the bench measures, this script compares the measurements with the
goals the issues state. Usage::

    python benchmarks/goals.py bench_out/results.json [more results.json ...]

Records from several runs are pooled (e.g. a table run, a ``--profile-only`` run and an ``--against
ctranslate2`` run). Prints one line per goal it has data for: value, goal, met or not, and where it came from.
"""

from __future__ import annotations

import json
import sys
from typing import Sequence

GOALS = {
    "speedup_t0_b1": ("speculative / temperature_sample (T=0, batch 1, best γ)", 1.5),
    "speedup_t1_b1": ("speculative / temperature_sample (T=1, batch 1, best γ)", 1.3),
    "measured_over_expected": ("measured / paper-expected speedup (T=0, batch 1, best γ)", 0.85),
    "spec_over_ct2_float32_b1": ("speculative / CTranslate2 float32 tokens/s (batch 1, best threads)", 2.0),
    "spec_over_ct2_int8_b1": ("speculative / CTranslate2 int8 tokens/s (batch 1, best threads)", 1.0),
    "specjax_over_ct2_float32_b32": ("best specjax / CTranslate2 float32 tokens/s (batch 32)", 1.0),
    "specjax_vs_hf_assisted": ("specjax speculative vs transformers assisted (T=0, batch 1)", 3.0),
    "fixed_cost_b1_inverse": ("1.5 ms / fixed per-call cost of speculative_sample (batch 1)", 1.0),
}


def goal_ratios(
    records: Sequence[dict], hf: dict | None = None, ct2: dict | None = None, profiles: Sequence[dict] | None = None
) -> dict:
    """goal key -> {"value", "goal", "what", "where"} for every goal the inputs measure."""
    out = {}
    for temp, key in ((0.0, "speedup_t0_b1"), (1.0, "speedup_t1_b1")):
        rows = [r for r in records if r["temperature"] == temp and r["batch_size"] == 1]
        if rows:
            best = max(rows, key=lambda r: r["speedup"])
            where = f"{best['task']} {best['draft']} γ={best['gamma']}"
            out[key] = {"value": best["speedup"], "where": where}
            if temp == 0.0:
                out["measured_over_expected"] = {"value": best["speedup_over_expected"], "where": where}
    if hf and hf.get("greedy"):
        out["specjax_vs_hf_assisted"] = {
            "value": hf["greedy"]["hf_assisted_over_specjax_spec"],
            "where": f"γ={hf['gamma']}, {hf['num_inputs']} inputs",
        }
    if ct2:
        by = {}
        for r in ct2["records"]:
            by.setdefault(int(r["batch_size"]), {})[r["method"]] = r["tokens_per_s"]
        for bs, methods in by.items():
            spec = max((v, k) for k, v in methods.items() if k.startswith("specjax speculative"))
            best = max((v, k) for k, v in methods.items() if k.startswith("specjax"))
            for ct in ("float32", "int8"):
                peer = max(((v, k) for k, v in methods.items() if k.startswith(f"ctranslate2 {ct}")), default=None)
                if peer is None:
                    continue
                if bs == 1:
                    out[f"spec_over_ct2_{ct}_b1"] = {"value": spec[0] / peer[0], "where": f"{spec[1]} vs {peer[1]}"}
                if bs == 32 and ct == "float32":
                    out["specjax_over_ct2_float32_b32"] = {
                        "value": best[0] / peer[0],
                        "where": f"{best[1]} vs {peer[1]}",
                    }
    for p in profiles or []:
        if p["batch_size"] == 1 and p["temperature"] == 0:
            out["fixed_cost_b1_inverse"] = {
                "value": 1.5 / max(1e-9, p["speculative"]["fixed_ms"]),
                "where": f"fixed cost {p['speculative']['fixed_ms']:.2f} ms, γ={p['gamma']}",
            }
    for key, d in out.items():
        d["what"], d["goal"] = GOALS[key]
    return out


def format_goals(goals: dict) -> str:
    """Text lines: each goal ratio, its goal and whether it is met."""
    lines = ["goals (ratios measured side by side in one run):"]
    for key in GOALS:
        if key in goals:
            g = goals[key]
            ok = "met" if g["value"] >= g["goal"] else "NOT met"
            lines.append(f"  {g['what']:<70} {g['value']:6.2f}  (goal >= {g['goal']:g}: {ok}; {g['where']})")
    return "\n".join(lines)


def main(paths: Sequence[str]) -> int:
    records, hf, ct2, profiles = [], None, None, []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            res = json.load(f)
        records += res.get("records") or []
        hf = res.get("hf_compare") or hf
        ct2 = res.get("ctranslate2") or ct2
        profiles += res.get("profiles") or []
    print(format_goals(goal_ratios(records, hf, ct2, profiles)))
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python benchmarks/goals.py RESULTS_JSON [RESULTS_JSON ...]")
    sys.exit(main(sys.argv[1:]))

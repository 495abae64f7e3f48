"""Reports of bench records: the paper's Table 2 as Markdown, CSV, and the α / speedup plots.

Records are the dicts ``experiment.run_row`` returns. Columns whose field a record lacks stay empty. The
drafting-variant columns (``VARIANT_COLUMNS``: verification, confidence threshold) are in every CSV; the
Markdown table shows them, after the paper's six columns, only when some record is not the default variant
(token verification, no threshold), so a default run's table is unchanged.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specjax.bench.theory import expected_improvement

__all__ = ["TABLE_COLUMNS", "VARIANT_COLUMNS", "CSV_COLUMNS", "format_markdown", "write_csv", "plot_records"]

TABLE_COLUMNS = [
    # (key, header, format) -- the first six are the paper's Table 2 layout.
    ("task", "task", "{}"),
    ("draft", "draft", "{}"),
    ("temperature", "temp", "{:g}"),
    ("gamma", "γ", "{}"),
    ("alpha", "α", "{:.3f}"),
    ("speedup", "speedup", "{:.2f}x"),
    ("alpha_source", "α source", "{}"),
    ("accepted_fraction", "accepted fraction", "{:.3f}"),
    ("mean_accepted_length", "mean accepted length", "{:.2f}"),
    ("accepted_per_position", "accepted per position", "{}"),
    ("paper_alpha", "paper α", "{:.2f}"),
    ("paper_speedup", "paper speedup", "{:.1f}x"),
    ("expected_improvement", "expected (theory)", "{:.2f}x"),
    ("speedup_over_expected", "measured/expected", "{:.2f}"),
    ("c", "c", "{:.3f}"),
    ("window_over_step", "window/step", "{:.2f}"),
    ("tokens_per_call", "tokens/call", "{:.2f}"),
    ("expected_tokens_per_call", "expected tokens/call", "{:.2f}"),
    ("batch_size", "batch", "{}"),
    ("target", "target", "{}"),
    ("num_inputs", "inputs", "{}"),
    ("spec_tokens_per_s", "spec tok/s", "{:.1f}"),
    ("base_tokens_per_s", "base tok/s", "{:.1f}"),
    ("spec_compile_seconds", "spec compile s", "{:.1f}"),
    ("base_compile_seconds", "base compile s", "{:.1f}"),
]

# (key, header, format): which drafting variant a record measured (see ``_is_variant``).
VARIANT_COLUMNS = [("verification", "verification", "{}"), ("confidence_threshold", "confidence threshold", "{:g}")]


def _is_variant(rec: dict) -> bool:
    """Whether a record is not the default variant: block verification or a confidence threshold."""
    return rec.get("verification", "token") != "token" or rec.get("confidence_threshold") is not None


def _variant_label(rec: dict) -> str:
    """'' for the default variant, else e.g. ' block', ' conf 0.5' (plot legends, progress lines)."""
    parts = [] if rec.get("verification", "token") == "token" else [str(rec["verification"])]
    if rec.get("confidence_threshold") is not None:
        parts.append(f"conf {rec['confidence_threshold']:g}")
    return "".join(" " + p for p in parts)


def _quality_text(rec: dict, which: str) -> str:
    q = rec.get(f"quality_{which}") or {}
    return " ".join(f"{k}={v:.1f}" for k, v in q.items() if isinstance(v, float))


def _cell(rec: dict, key: str, fmt: str) -> str:
    v = rec.get(key)
    if v is None:
        return ""
    if isinstance(v, (list, tuple)):
        return " ".join(str(x) for x in v)
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def format_markdown(records: Sequence[dict]) -> str:
    """The records as a Markdown table: the paper's Table 2 columns (task, draft, temp, γ, α, speedup) first,
    then verification and confidence threshold (only when some record is block verification or has a
    threshold), the paper's numbers, theory, c, tokens per call, throughput, compile times and quality, then
    one line with the environment (jax version, backend, device kind and count)."""
    has_q = any(r.get("quality_spec") for r in records)
    columns = TABLE_COLUMNS[:6] + (VARIANT_COLUMNS if any(map(_is_variant, records)) else []) + TABLE_COLUMNS[6:]
    heads = [h for _, h, _ in columns] + (["quality (spec)", "quality (base)"] if has_q else [])
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in records:
        cells = [_cell(r, k, f) for k, _, f in columns]
        if has_q:
            cells += [_quality_text(r, "spec"), _quality_text(r, "base")]
        lines.append("| " + " | ".join(cells) + " |")
    if records:
        e = records[0]
        lines.append("")
        lines.append(
            f"jax {e['jax']}, backend {e['backend']}, {e['device_count']} x {e['device_kind']}; "
            "speedup = temperature_sample time / speculative_sample time on the same inputs, after "
            "compilation; expected = (1 − α^(γ+1)) / ((1 − α)(γc + 1)) with the measured α and c; α = the paper's "
            "mean of β = Σ min(p, q) over verified positions, measured in the loop (α source 'loop') or "
            "inverted from tokens per target call ('tokens_per_call'); accepted fraction = accepted / "
            "drafted; accepted per position = how often draft position 1…γ was accepted."
        )
        if any(map(_is_variant, records)):
            lines[-1] += (
                " verification: token = Leviathan et al. 2023, Algorithm 1; block = Sun et al. 2025. "
                "confidence threshold: each row stops drafting after a draft token whose probability "
                "is below it (γ is then the most drafted per iteration; empty = off)."
            )
        if any(r.get("max_ngram") is not None for r in records):
            lines[-1] += (
                " draft prompt-lookup: n-gram proposals from the input and the output so far, no draft "
                "model (c = 0 in the theory; the lookup's cost is in the measured speedup)."
            )
        if any(r.get("confidence_threshold") is not None or r.get("max_ngram") is not None for r in records):
            lines[-1] += (
                " The theory assumes γ tokens drafted every iteration; confidence-stopped and "
                "prompt-lookup rows draft fewer (prompt lookup none when no n-gram matches), which "
                "the expected columns do not model."
            )
    return "\n".join(lines) + "\n"


CSV_COLUMNS = (
    [k for k, _, _ in TABLE_COLUMNS]
    + [
        "alpha_loop",
        "alpha_from_tokens",
        "expected_improvement_window",
        "draft_step_ms",
        "target_step_ms",
        "target_window_ms",
        "iteration_ms",
        "spec_seconds",
        "base_seconds",
        "repeats",
        "max_decode_length",
        "greedy_identical",
        "quality_spec",
        "quality_base",
        "jax",
        "backend",
        "device_kind",
        "device_count",
    ]
    + [k for k, _, _ in VARIANT_COLUMNS]
    + ["max_ngram"]
)


def write_csv(records: Sequence[dict], path: str) -> None:
    """One CSV line per record, columns ``CSV_COLUMNS`` (quality as ``name=value`` pairs; per-row α is in the
    JSON only; ``verification`` "token" and an empty ``confidence_threshold`` for records without them)."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in records:
            w.writerow(
                [
                    _quality_text(r, k[len("quality_") :])
                    if k.startswith("quality_")
                    else _cell(dict({"verification": "token"}, **r), k, "{}")
                    for k in CSV_COLUMNS
                ]
            )


def plot_records(records: Sequence[dict], out_dir: str) -> list[str]:
    """Two PNGs (matplotlib, Agg): ``alpha_vs_gamma.png`` (α measured per γ, with the paper's α, and tokens
    per target call measured next to (1 − α^(γ+1)) / (1 − α)) and ``speedup_vs_gamma.png`` (measured speedup
    next to the theory curve at the measured α and c, and the paper's speedup). One series per
    (task, draft, temperature, batch size, verification, confidence threshold). Returns the paths written."""
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple, list[dict]] = {}
    for r in (r for r in records if isinstance(r["gamma"], int)):  # a gamma "auto" row has no place on a γ axis
        series.setdefault((r["task"], r["draft"], r["temperature"], r["batch_size"], _variant_label(r)), []).append(r)
    paths = []
    fig, (ax_a, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2))
    fig2, ax_s = plt.subplots(figsize=(6.5, 4.2))
    for i, (key, rs) in enumerate(sorted(series.items(), key=lambda kv: str(kv[0]))):
        rs = sorted(rs, key=lambda r: r["gamma"])
        color = f"C{i % 10}"
        label = f"{key[0]} {key[1]}{key[4]} T={key[2]:g}" + (f" b={key[3]}" if key[3] != 1 else "")
        g = [r["gamma"] for r in rs]
        ax_a.plot(g, [r["alpha"] for r in rs], "o-", color=color, label=f"{label} α")
        ax_a.plot(g, [r["accepted_fraction"] for r in rs], "s:", color=color, label=f"{label} accepted fraction")
        ax_t.plot(g, [r["tokens_per_call"] for r in rs], "o-", color=color, label=f"{label} measured")
        ax_t.plot(g, [r["expected_tokens_per_call"] for r in rs], "x--", color=color, label=f"{label} theory")
        ax_s.plot(g, [r["speedup"] for r in rs], "o-", color=color, label=f"{label} measured")
        # Theory at the mean measured α and c over this series, on a dense γ grid.
        alpha = float(np.mean([r["alpha"] for r in rs]))
        c = float(np.mean([r["c"] for r in rs]))
        dense = np.arange(1, max(max(g), 1) + 1)
        ax_s.plot(
            dense,
            [expected_improvement(alpha, int(x), c) for x in dense],
            "--",
            color=color,
            label=f"{label} theory (α={alpha:.2f}, c={c:.3f})",
        )
        for r in rs:
            if r.get("paper_alpha") is not None:
                ax_a.plot([r["gamma"]], [r["paper_alpha"]], "*", color=color, markersize=12)
            if r.get("paper_speedup") is not None:
                ax_s.plot([r["gamma"]], [r["paper_speedup"]], "*", color=color, markersize=12)
    ax_a.set(
        xlabel="γ (draft tokens per target call)",
        ylabel="α (paper §3.1) and accepted fraction",
        title="α (★ = paper)",
        ylim=(0, 1.02),
    )
    ax_t.set(xlabel="γ", ylabel="tokens per target call", title="tokens per target call: measured vs theory")
    ax_s.axhline(1.0, color="grey", lw=0.8)
    ax_s.set(
        xlabel="γ (draft tokens per target call)",
        ylabel="walltime speedup",
        title="speedup over temperature_sample (★ = paper)",
    )
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


def run_subcommands(doc: str, subcommands: dict, argv: list | None = None) -> int:
    """A benchmark script's entry point: ``python benchmarks/NAME.py SUBCOMMAND [flags]`` runs
    ``subcommands[SUBCOMMAND][0]()`` with ``sys.argv`` as its own (``NAME.py SUBCOMMAND`` as the program name);
    with no or an unknown subcommand prints ``doc``'s first paragraph and each subcommand's first doc line.
    Returns the exit status (0 for ``-h``, 2 for a missing or unknown subcommand)."""
    import sys

    argv = sys.argv if argv is None else argv
    if len(argv) < 2 or argv[1] not in subcommands:
        print(doc.strip().split("\n\n")[0] + "\n\nsubcommands (each with --help):", file=sys.stderr)
        for name, (_, text) in subcommands.items():
            print(f"  {name:14s} {text.strip().splitlines()[0]}", file=sys.stderr)
        return 0 if argv[1:2] in (["-h"], ["--help"]) else 2
    sub = argv.pop(1)
    argv[0] = f"{argv[0]} {sub}"
    code = subcommands[sub][0]()
    return code if isinstance(code, int) else 0

"""Loss curves of `specjax train` runs, with validation BLEU beside them, as one PNG.

Reads each run's ``log.jsonl`` (one record per ``log_every`` steps: ``step``, ``ce`` — the plain cross-entropy
in nats per target token, also under label smoothing — and ``loss``, the objective optimised) and, optionally,
files of ``benchmarks/target_bleu.py`` output lines (``.../step_N.msgpack val ... BLEU = x ...``), whose
validation BLEU per snapshot step is drawn on a second axis. Nothing is computed here beyond reading.

Cited by docs/training.md ("What did not work": AdamW against Adafactor on the small target). Output, as
committed (R=benchmarks/results/training)::

    python benchmarks/plot_training.py $R/2026-12-06_target_curves.png --tokens-per-batch 4096 \
        --log "AdamW 4e-4, embedding learning rate x22.6 (test BLEU 25.81)=$R/2026-12-06_target_adamw_log.jsonl" \
        --log "Adafactor 1e-2, shipped after averaging (test BLEU 31.63)=$R/2026-12-06_target_adafactor_log.jsonl"
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

BLEU_LINE = re.compile(r"step_(\d+)\.msgpack\s+(val|test)\b.*?BLEU = ([\d.]+)")


def read_log(path: str | Path) -> tuple[list[int], list[float]]:
    """(steps, plain cross-entropy in nats) of a run's log.jsonl; a record without ``ce`` uses ``loss``.

    Raises:
      FileNotFoundError: no such file. ValueError: no records in it.
    """
    steps, ce = [], []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            steps.append(int(rec["step"]))
            ce.append(float(rec.get("ce", rec["loss"])))
    if not steps:
        raise ValueError(f"{path} holds no log records.")
    return steps, ce


def read_bleu(path: str | Path, split: str = "val") -> tuple[list[int], list[float]]:
    """(snapshot steps, BLEU) of the ``split`` lines of a file of ``target_bleu.py`` outputs, sorted by step."""
    points = {}
    for line in Path(path).read_text().splitlines():
        m = BLEU_LINE.search(line)
        if m and m.group(2) == split:
            points[int(m.group(1))] = float(m.group(3))
    return sorted(points), [points[k] for k in sorted(points)]


def _labelled(arg: str) -> tuple[str, str]:
    label, sep, path = arg.partition("=")
    return (label, path) if sep else (Path(arg).parent.name or arg, arg)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the PNG to write")
    ap.add_argument("--log", action="append", required=True, metavar="[LABEL=]LOG_JSONL")
    ap.add_argument("--bleu", action="append", default=[], metavar="[LABEL=]BLEU_TXT")
    ap.add_argument(
        "--tokens-per-batch",
        type=int,
        default=2048,
        help="the runs' --tokens-per-batch, for the x axis label (default: 2048)",
    )
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for arg in args.log:
        label, path = _labelled(arg)
        steps, ce = read_log(path)
        ax.plot(steps, ce, label=f"{label}: training cross-entropy")
    ax.set_xlabel(f"step ({args.tokens_per_batch:,} target tokens each)")
    ax.set_ylabel("training cross-entropy (nats / token)")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if args.bleu:
        ax2 = ax.twinx()
        for i, arg in enumerate(args.bleu):
            label, path = _labelled(arg)
            steps, bleu = read_bleu(path)
            ax2.plot(steps, bleu, "o--", color=f"C{len(args.log) + i}", label=f"{label}: validation BLEU (greedy)")
        ax2.set_ylabel("Multi30k validation BLEU")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="center right", fontsize=8)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The paper's TPU setup compiled and costed ahead of time: T5 1.1 XXL (bfloat16) with T5 1.1 small / base / large
drafts for TPU v4 / v5e slices, on a CPU host without a TPU (``specjax.aot``; needs ``pip install
'specjax[tpu-aot]'``).

For each slice (one v4 chip, v4-8 with model:4, v5e-8 with model:8, v4-32 with data:4,model:4): the whole
``speculative_sample`` (each draft) and ``temperature_sample`` programs as ``model_parallel_sample`` runs them
(γ 7, batch 1, 512 input / 128 output tokens, greedy), then the pieces (target step, windows for γ 3 / 5 / 7,
each draft's step), c, window / step and the paper's Table 2 projected. Times are estimates read from the
compiled programs (the HBM traffic of ``specjax.aot.hbm_traffic`` and XLA's cost model), not a measurement.
Compile times are this host's (say which CPU and whether it was loaded when quoting them).

Usage:
  python benchmarks/tpu_aot.py [--only v4-8,v4-1] [--drafts small,base,large] [--no-base-program]
      [--before PATH.json ...] [--out benchmarks/results/tpu_aot/2026-12-07_xxl]
Writes ``OUT.md`` (tables) and ``OUT.json`` (the reports, no HLO).
``--before``: JSON files written by an earlier run (e.g. the unrolled layers) whose compile times and code sizes
are shown beside this run's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from specjax import aot  # noqa: E402

RUNS = (("v4-1", None), ("v4-8", "data:1,model:4"), ("v5e-8", "data:1,model:8"), ("v4-32", "data:4,model:4"))
DRAFTS = {"small": "t5_1_1_small", "base": "t5_1_1_base", "large": "t5_1_1_large"}


def _host() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{model}, {os.cpu_count()} cores, load average {load:.1f} at the start ({platform.machine()})"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def _cpu(p: dict) -> str:
    """' (CPU 123.4)' when the record has the compile's CPU seconds (all threads), else ''."""
    return f" (CPU {p['compile_cpu_seconds']:.1f})" if "compile_cpu_seconds" in p else ""


def _program(report: dict, name: str) -> dict | None:
    return next((p for p in report["programs"] if p["name"] == name), None)


def _markdown(reports: list[dict], before: list[dict], host: str) -> str:
    lines = [
        "# T5 1.1 XXL speculative decoding compiled for TPU ahead of time (no TPU; `specjax aot`)",
        "",
        f"Compiled on: {host}; commit {_commit()}. Target T5 1.1 XXL bfloat16, γ 7, batch 1, 512 input / 128 output "
        "tokens, temperature 0, token verification. **No figure here is a run.** Per piece two readings of the "
        "compiled program: XLA's cost model (cost_analysis bytes accessed, which counts every on-chip prefetch of a "
        "kernel or cache as more accesses, over the HBM bandwidth; or flops over the peak bf16 FLOP/s if larger) "
        "and the HBM traffic read from the compiled HLO (`specjax.aot.hbm_traffic`: each buffer moved between HBM "
        "and the chip counted once; or the MXU time if larger), the estimate c, window / step and the projections "
        "use. Floor = (weights a step reads + caches and cross-attention memory per device) / bandwidth.",
        "",
        "## Whole programs (layers scanned)",
        "",
        "| slice, mesh | program | draft | compile s | code MB | per device GB: arguments + temporaries (of HBM) | "
        "decode loops | collectives per iteration | whole-cache copies per iteration | host transfers |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        for p in r["programs"]:
            where = f"{r['topology']} data:{r['mesh']['data']},model:{r['mesh']['model']}"
            if not p["compiled"]:
                lines.append(f"| {where} | {p['name']} | | failed: {p['error'].splitlines()[0][:120]} | | | | | | |")
                continue
            m, loop = p["bytes_per_device"], p.get("loop", {})
            coll = ", ".join(
                f"{op} {v['count']} ({v['bytes'] / 1e6:.2f} MB)" for op, v in loop.get("collectives", {}).items()
                if v["count"]
            ) or "none"  # fmt: skip
            host_ops = loop.get("host_transfers", []) + loop.get("host_callbacks", [])
            copies = loop.get("cache_copies", {})
            lines.append(
                f"| {where} | {p['name']} | {r['draft'] if p['name'] == 'speculative_sample' else '—'} | "
                f"{p['compile_seconds']:.1f}{_cpu(p)} | {p['generated_code_bytes'] / 1e6:.1f} | "
                f"{m['arguments'] / 1e9:.2f} + {m['temporaries'] / 1e9:.2f} ({p['hbm_bytes'] / 2**30:.0f} GiB) | "
                f"{loop.get('decode_loops')} | {coll} | "
                f"{copies.get('count', 0)} ({copies.get('bytes', 0) / 1e6:.1f} MB) | {', '.join(host_ops) or 'none'} |"
            )
    if before:
        lines += [
            "",
            "## Before / after (speculative_sample, small draft; same host)",
            "",
            "| slice, mesh | before: compile s | before: code MB | after: compile s | after: code MB |",
            "|---|---|---|---|---|",
        ]
        for b in before:
            pb = _program(b, "speculative_sample")
            key = (b["topology"], b["mesh"], b["draft"])
            after = next((r for r in reports if (r["topology"], r["mesh"], r["draft"]) == key), None)
            pa = after and _program(after, "speculative_sample")
            if not pb or not pb["compiled"]:
                continue
            a_s = (
                f"{pa['compile_seconds']:.1f} | {pa['generated_code_bytes'] / 1e6:.1f}"
                if pa and pa["compiled"]
                else "— | —"
            )
            lines.append(
                f"| {b['topology']} data:{b['mesh']['data']},model:{b['mesh']['model']} | "
                f"{pb['compile_seconds']:.1f}{_cpu(pb)} | {pb['generated_code_bytes'] / 1e6:.1f} | {a_s} |"
            )
    lines += [
        "",
        "## Pieces, c and window / step (HBM traffic estimate; XLA's cost model in brackets)",
        "",
        "| slice | target step ms | floor ms | step / floor | window γ 7 ms | window / step γ 3, 5, 7 | draft | "
        "draft step ms | c | paper c |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        pieces = r.get("pieces") or {}
        step, window, draft = (pieces.get(k, {}) for k in ("target_step", "target_window", "draft_step"))
        if not step.get("compiled"):
            continue
        ws = ", ".join(f"{v:.3f}" for _, v in sorted(r.get("window_over_step_by_gamma", {}).items()))
        ws_raw = ", ".join(f"{v:.3f}" for _, v in sorted(r.get("window_over_step_by_gamma_cost_model", {}).items()))
        floor = step["floor_seconds"]
        lines.append(
            f"| {r['topology']} | {step['estimate_seconds'] * 1e3:.2f} ({step['cost_model_seconds'] * 1e3:.2f}) | "
            f"{floor * 1e3:.2f} | {step['estimate_seconds'] / floor:.3f} ({step['cost_model_seconds'] / floor:.2f}) "
            f"| {window.get('estimate_seconds', 0) * 1e3:.2f} ({window.get('cost_model_seconds', 0) * 1e3:.2f}) | "
            f"{ws} ({ws_raw}) | {r['draft']} | {draft.get('estimate_seconds', 0) * 1e3:.3f} "
            f"({draft.get('cost_model_seconds', 0) * 1e3:.3f}) | {r['c']:.4f} ({r['c_cost_model']:.4f}) | "
            f"{r.get('paper_c')} |"
        )
    lines += [
        "",
        "## The paper's Table 2 projected: (1 - α^(γ+1)) / ((1 - α)(γc + w)), the paper's α, this c and w",
        "",
        "| slice | task | draft | T | γ | paper α | paper speedup | Table 4 expectation | projected | "
        "projected, XLA's cost model |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        for p in r.get("projections", []):
            raw = p.get("projected_speedup_cost_model")
            lines.append(
                f"| {r['topology']} | {p['task']} | {p['draft']} | {p['temperature']} | {p['gamma']} | "
                f"{p['paper_alpha']} | {p['paper_speedup']}x | {p['paper_expected']}x | {p['projected_speedup']:.2f}x "
                f"| {'—' if raw is None else f'{raw:.2f}x'} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated slices (default: all four)")
    parser.add_argument("--drafts", default="small,base,large")
    parser.add_argument("--programs", default="speculative_sample,temperature_sample")
    parser.add_argument("--no-pieces", action="store_true")
    parser.add_argument("--before", nargs="*", default=[], help="earlier JSON outputs to compare compile times with")
    parser.add_argument("--out", default="benchmarks/results/tpu_aot/2026-12-07_xxl")
    parser.add_argument("--merge", nargs="*", default=None, help="only write OUT.md/.json from these JSON outputs")
    args = parser.parse_args(argv)
    before = []
    for path in args.before:
        with open(path) as f:
            data = json.load(f)
        before += data["reports"] if "reports" in data else [data]
    if args.merge is not None:
        merged, host = [], None
        for path in args.merge:
            with open(path) as f:
                data = json.load(f)
            merged += data["reports"]
            host = host or data["host"]
        with open(args.out + ".json", "w") as f:
            json.dump({"host": host, "commit": _commit(), "reports": merged, "before": before}, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(_markdown(merged, before, host))
        print(f"wrote {args.out}.md and {args.out}.json")
        return 0
    aot.require_libtpu()
    host = _host()
    only = None if args.only is None else set(args.only.split(","))
    reports = []
    for topology, mesh in RUNS:
        if only is not None and topology not in only:
            continue
        reuse = None
        for i, draft in enumerate(args.drafts.split(",")):
            start = time.perf_counter()
            report = aot.compile_report(
                topology,
                "t5_1_1_xxl",
                DRAFTS[draft],
                mesh=mesh,
                programs=tuple(p for p in args.programs.split(",") if p and (i == 0 or p == "speculative_sample")),
                pieces=not args.no_pieces,
                reuse_pieces=reuse,
                log=lambda line: print(time.strftime("%H:%M:%S"), line, flush=True),
            )
            report["wall_seconds"] = round(time.perf_counter() - start, 1)
            reuse = report.get("pieces")
            reports.append(report)
            os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
            with open(args.out + ".json", "w") as f:
                json.dump({"host": host, "commit": _commit(), "reports": reports}, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(_markdown(reports, before, host))
    print(f"wrote {args.out}.md and {args.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

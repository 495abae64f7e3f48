"""A newcomer's first and second ``specjax demo``: wall time to the first translation and to the end, with an empty
cache directory and then with the one the first run filled (XLA's compiled programs, γ auto's measured costs).

    python benchmarks/demo_first_run.py --runs 2 [--size small] [demo flags ...] > RESULT.md

Each run is ``python -m specjax demo --cache-dir DIR`` in its own process, started from the repository root; the
first translation is the first ``DE:`` line on stdout. Prints a Markdown table with the machine (CPU model, flags,
load average before each run) and the demo's own compile / first-pass / cost-measurement line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_run(cache: str, extra: list[str]) -> dict:
    """Runs the demo once; returns wall seconds to the first translation and to the end, and its timing lines."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the command's default: under --cache-dir
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specjax", "demo", "--cache-dir", cache, *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    first, lines = None, []
    for line in proc.stdout:
        if first is None and line.startswith("DE:"):
            first = time.perf_counter() - t0
        lines.append(line.rstrip("\n"))
    status = proc.wait()
    total = time.perf_counter() - t0
    timing = [line for line in lines if line.startswith(("speedup", "not timed"))]
    return dict(status=status, first=first, total=total, load=load, timing=timing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args, extra = parser.parse_known_args()
    from specjax.hardware import cpu_info

    info = cpu_info()
    print(f"CPU: {info.describe()}; {sys.version.split()[0]}; demo flags: {' '.join(extra) or '(none)'}\n")
    print("| run | cache | load average before | first translation s | whole demo s | exit |")
    print("|---|---|---|---|---|---|")
    notes = []
    with tempfile.TemporaryDirectory(prefix="specjax-demo-cache-") as cache:
        for i in range(1, args.runs + 1):
            r = one_run(cache, extra)
            state = "empty" if i == 1 else "filled by run 1"
            first = f"{r['first']:.1f}" if r["first"] is not None else "-"
            print(f"| {i} | {state} | {r['load']:.1f} | {first} | {r['total']:.1f} | {r['status']} |")
            notes += [f"run {i}: {line}" for line in r["timing"]]
    print("\n" + "\n".join(f"- {n}" for n in notes))


if __name__ == "__main__":
    main()

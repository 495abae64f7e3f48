"""The multi-draft verification window of T5 1.1 XXL compiled for one TPU v4 chip ahead of time and costed against
the one-token step and the single-draft window (``specjax.aot``'s pieces; needs ``pip install 'specjax[tpu-aot]'``).

Usage (from the repository root; no TPU needed):
  python benchmarks/multi_draft_aot.py --cpu-name "..." --out benchmarks/results/multi_draft/2026-12-07_xxl_v4-1.md

Pieces, each its own program with the loop's parameter shardings and a donated cache (as ``specjax aot``
compiles them, layers unrolled so XLA's cost analysis sees every layer), batch 1, 512 input tokens, 128 output
tokens, bfloat16: the target step (one token), the single-draft window (γ + 1 tokens), and the multi-draft window
(``decode_branches`` over k · (γ + 1) query rows, then ``commit_branch`` of one branch into the cache) for each
(k, γ). Times are estimates read from the compiled programs (``aot._piece_costs``: the HBM traffic read from the
HLO, or the MXU time if larger; XLA's cost model beside it), not a run. Cited by docs/architecture.md.
"""

import argparse
import os
import pathlib
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from specjax import aot, parallel  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", default="v4-1")
    p.add_argument("--cases", default="2:7,4:7,4:3", help="k:γ pairs of multi-draft windows (default 2:7,4:7,4:3)")
    p.add_argument("--cpu-name", required=True, help="the compiling host, in words (and whether it was loaded)")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    aot.require_libtpu()
    topo = aot._topology(a.topology)
    chip = aot.CHIPS[topo.chip]
    devices = aot.topology_devices(topo.name)
    tcfg = aot.resolve_config("t5_1_1_xxl", "bfloat16")
    mesh = aot._mesh(devices[:1], 1, 1)
    rules = parallel.STANDARD_RULES
    fns, params = aot._unrolled(tcfg, mesh, rules)
    rows, s, T = 1, 512, 128
    cases = [tuple(int(v) for v in c.split(":")) for c in a.cases.split(",")]
    gammas = sorted({g for _, g in cases})
    todo = [("step", 1, max(gammas), None)]
    todo += [(f"window γ {g}", g + 1, g, None) for g in gammas]
    todo += [(f"branches k {k} γ {g}", g + 1, g, k) for k, g in cases]
    results = {}
    for name, width, g, k in todo:
        length = T + g + 1
        if k is None:
            trace = aot._piece_trace(fns, params, mesh, rules, rows, s, length, width)
        else:
            trace = aot._branch_trace(fns, params, mesh, rules, rows, s, length, k, width)
        print(f"compiling {name} ...", flush=True)
        record, compiled = aot._compile(name, trace, chip.hbm_bytes)
        if compiled is None:
            print(record["error"][:2000])
            results[name] = record
            continue
        record.update(aot._piece_costs(compiled, chip, (0, 0)))
        results[name] = record
        print(
            f"  {record['estimate_seconds'] * 1e3:.3f} ms (HBM traffic estimate), "
            f"{record['cost_model_seconds'] * 1e3:.3f} ms (XLA's cost model), compile {record['compile_seconds']} s",
            flush=True,
        )
    step = results["step"]
    lines = [
        f"# Multi-draft verification window, T5 1.1 XXL (bfloat16) on {topo.name}, compiled ahead of time",
        "",
        f"Compiled on: {a.cpu_name}; jax {jax.__version__}. **No figure here is a run**: each is read from the "
        "compiled program (`specjax.aot._piece_costs`): the HBM traffic read from the HLO over the chip's bandwidth, "
        "or the MXU time if larger (XLA's cost model in brackets). Batch 1, 512 input / 128 output tokens, layers "
        "unrolled, cache donated; a multi-draft window is `decode_branches` of k · (γ + 1) query rows plus "
        "`commit_branch` of the kept branch.",
        "Command: `python benchmarks/multi_draft_aot.py "
        + " ".join(f'"{x}"' if " " in x else x for x in sys.argv[1:])
        + "`",
        "",
        "| piece | query rows | estimate ms | / one-token step | XLA cost model ms | / step (cost model) | compile s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, width, _, k in todo:
        r = results[name]
        if not r.get("compiled"):
            lines.append(f"| {name} | {width * (k or 1)} | failed: {r.get('error', '')[:200]} | | | | |")
            continue
        lines.append(
            f"| {name} | {width * (k or 1)} | {r['estimate_seconds'] * 1e3:.3f} | "
            f"{r['estimate_seconds'] / step['estimate_seconds']:.3f} | {r['cost_model_seconds'] * 1e3:.3f} | "
            f"{r['cost_model_seconds'] / step['cost_model_seconds']:.3f} | {r['compile_seconds']} |"
        )
    lines.append("")
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    print("wrote", out)


if __name__ == "__main__":
    main()

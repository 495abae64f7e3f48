"""The drafting variants measured on a shipped pair: token vs block verification, confidence-stopped drafting vs
fixed γ, prompt lookup (no draft model), each against temperature_sample on the same inputs, side by side.

Every variant of a (task, batch size, temperature) group is compiled first, then all variants and the baseline
run alternately over the same batches, ``--repeats`` times; the table gives the best pass of each (tokens/s),
its speedup over the baseline's best pass, tokens per target call and the paper's α (mean of β over verified
positions, accumulated in the loop). Nothing is asserted; the machine is shared, so only ratios within a group
mean anything.

    python benchmarks/drafting_variants.py --out benchmarks/results/drafting_variants/YYYY-MM-DD_multi30k.md

Cited by docs/benchmarks.md ("Drafting variants"). Output: the ``--out`` table,
``benchmarks/results/drafting_variants/YYYY-MM-DD_multi30k.md`` (and ``_other.md`` for the other tasks).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np

import specjax
from specjax.decoding import inputs

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
TASKS = {  # name: (input file, lines, max_decode_length, max_input_length)
    "multi30k": ("train/multi30k/test_2016_flickr.en", 32, 64, 64),
    "newstest2014": ("wmt/newstest2014.en", 24, 96, 128),
    "cnndm": ("cnndm/cnndm_test_frank250.source", 8, 64, 512),
}


def variants(gammas, thresholds, lookup_gamma):
    out = []
    for g in gammas:
        out.append((f"token γ={g}", dict(gamma=g)))
        out.append((f"block γ={g}", dict(gamma=g, verification="block")))
    for c in thresholds:
        out.append((f"confidence {c} γ≤{max(gammas)}", dict(gamma=max(gammas), draft_confidence_threshold=c)))
    out.append((f"prompt lookup γ={lookup_gamma}", dict(gamma=lookup_gamma, draft="lookup")))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--gammas", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.5])
    ap.add_argument("--lookup-gamma", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--size", choices=["mini", "small"], default="mini", help="which shipped pair (cited: mini)")
    args = ap.parse_args(argv)

    target, draft, tok = specjax.load_default_pair(size=args.size)
    lookup = specjax.PromptLookupDraft(max_ngram=3)
    lines_out = [
        f"jax {jax.__version__} {jax.default_backend()}; shipped mini pair (distilled draft); best of "
        f"{args.repeats} passes, all variants alternating in one process",
        "",
        "| task | batch | temp | variant | tokens/s | speedup | tokens/call | α |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines_out), flush=True)
    for task in args.tasks:
        path, n, T, max_in = TASKS[task]
        text = (DATA / path).read_text(encoding="utf-8").splitlines()[:n]
        ids = [r[: max_in - 1] + [tok.eos_id] if len(r) > max_in else r for r in (tok.encode(t) for t in text)]
        for b in args.batch_sizes:
            xs = inputs.batches(ids, batch_size=b, length=inputs.bucket_length(max(len(r) for r in ids)))
            for temp in args.temperatures:
                runs = {
                    "baseline": lambda j, x: specjax.temperature_sample(
                        target, x, rng=jax.random.PRNGKey(j), max_decode_length=T, temperature=temp
                    )
                }
                for name, kw in variants(args.gammas, args.thresholds, args.lookup_gamma):
                    kw = dict(kw)
                    d = lookup if kw.pop("draft", None) == "lookup" else draft
                    runs[name] = (
                        lambda d, kw: (
                            lambda j, x: specjax.speculative_sample(
                                target, d, x, rng=jax.random.PRNGKey(j), max_decode_length=T, temperature=temp, **kw
                            )
                        )
                    )(d, kw)
                for fn in runs.values():  # compile every program first
                    jax.block_until_ready(fn(0, xs[0]).sequences)
                best = {}
                for _ in range(args.repeats):
                    for name, fn in runs.items():
                        t0, res = time.perf_counter(), []
                        for j, x in enumerate(xs):
                            r = fn(j, x)
                            jax.block_until_ready(r.sequences)
                            res.append(jax.device_get(r))
                        dt = time.perf_counter() - t0
                        tokens = sum(int(np.sum(r.lengths)) for r in res)
                        if name not in best or dt < best[name][0]:
                            best[name] = (dt, tokens, res)
                base_dt = best["baseline"][0]
                for name, (dt, tokens, res) in best.items():
                    calls = sum(int(np.sum(r.num_target_calls)) for r in res)
                    verified = sum(int(np.sum(r.num_verified)) for r in res)
                    alpha = sum(float(np.sum(r.beta_sum)) for r in res) / verified if verified else float("nan")
                    line = (
                        f"| {task} | {b} | {temp:g} | {name} | {tokens / dt:.0f} | {base_dt / dt:.2f}x | "
                        f"{tokens / calls:.2f} | {alpha:.3f} |"
                    )
                    lines_out.append(line)
                    print(line, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines_out) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

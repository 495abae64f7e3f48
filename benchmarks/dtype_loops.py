"""The small (or mini) pair's decode loops by dtype on this CPU: target alone in float32 and in bfloat16, and
speculative sampling with a bfloat16 or float32 target and a bfloat16 or float32 draft, side by side in one
process (alternating line by line, each line's best of ``--repeats``).

Prints each variant's total time over the lines and its ratio to both baselines, and checks that every greedy
speculative output equals the greedy target's of the same dtype (the decode contract; a float32 and a bfloat16
target may differ from each other). The compile options are the library's own (``specjax/decoding/xla_cpu.py``):
what a user gets.

    python benchmarks/dtype_loops.py --size small --gammas 3 5 7 --num-inputs 24
    python benchmarks/dtype_loops.py --gammas 5 6 7 --drafts float32 --extra-drafts d2=/work/runs/d2_export

``--extra-drafts NAME=DIR``: more drafts (any checkpoint ``specjax.load_checkpoint`` reads, run in float32)
beside the shipped one, each with the bfloat16 target, e.g. a draft of another depth before it ships. The last
column, tokens per target call (output tokens over target calls, summed over the lines), is what each draft
buys; its cost per call is what the total time adds.

Cited by README.md and docs/benchmarks.md (the small pair's headline speedup). Output, as committed:
``python benchmarks/dtype_loops.py --num-inputs 24 --gammas 4 5 6 7 --drafts float32 >
benchmarks/results/small_pair/YYYY-MM-DD_dtype_loops_N.txt``.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

import specjax
from specjax.bench.inputs import MULTI30K_TEST, encode_inputs, read_lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small", choices=["mini", "small"])
    ap.add_argument("--gammas", type=int, nargs="+", default=[3, 5, 7])
    ap.add_argument("--num-inputs", type=int, default=24, help="Multi30k test 2016 lines (default: 24)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--drafts",
        nargs="+",
        default=["float32", "bfloat16"],
        choices=["float32", "bfloat16"],
        help="draft dtypes to try beside the bfloat16 target (default: both)",
    )
    ap.add_argument(
        "--extra-drafts",
        nargs="+",
        default=[],
        metavar="NAME=DIR",
        help="more float32 drafts beside the bfloat16 target (checkpoint directories)",
    )
    args = ap.parse_args(argv)
    t32, d32, tok = specjax.load_default_pair(size=args.size, dtype="float32")
    t16, d16, _ = specjax.load_default_pair(size=args.size, dtype="bfloat16")
    drafts = {"float32": d32, "bfloat16": d16}
    extra = {}
    for item in args.extra_drafts:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            ap.error(f"--extra-drafts {item!r}: write NAME=DIR (e.g. d2=/work/runs/d2_export)")
        extra[name] = specjax.load_checkpoint(path, dtype="float32")
        if extra[name].config.vocab_size != d32.config.vocab_size:
            ap.error(
                f"--extra-drafts {item!r}: a {extra[name].config.vocab_size}-token vocabulary, not the "
                f"pair's {d32.config.vocab_size}"
            )
    ids = encode_inputs(tok, read_lines(MULTI30K_TEST, args.num_inputs), "", 64)
    lines = [np.array([r + [0] * (64 - len(r))], np.int32) for r in ids]
    T = 64

    def base(t):
        return lambda x: specjax.temperature_sample(t, x, max_decode_length=T, temperature=0.0)

    def spec(t, d, g):
        return lambda x: specjax.speculative_sample(t, d, x, gamma=g, max_decode_length=T, temperature=0.0)

    fns = {"target alone, float32": (base(t32), None), "target alone, bfloat16": (base(t16), None)}
    for g in args.gammas:
        fns[f"γ {g}: f32 target, f32 draft"] = (spec(t32, d32, g), "target alone, float32")
        for dd in args.drafts:
            fns[f"γ {g}: bf16 target, {'f32' if dd == 'float32' else 'bf16'} draft"] = (
                spec(t16, drafts[dd], g),
                "target alone, bfloat16",
            )
        for name, d in extra.items():
            fns[f"γ {g}: bf16 target, f32 {name}"] = (spec(t16, d, g), "target alone, bfloat16")
    outputs = {k: [] for k in fns}
    calls = {k: [0, 0] for k in fns}  # output tokens, target calls
    for x in lines[:1]:
        for f, _ in fns.values():  # compile
            jax.block_until_ready(f(x))
    best = {k: np.full(len(lines), np.inf) for k in fns}
    for r in range(args.repeats):
        for j, x in enumerate(lines):
            for k, (f, _) in fns.items():
                t0 = time.perf_counter()
                res = jax.block_until_ready(f(x))
                best[k][j] = min(best[k][j], time.perf_counter() - t0)
                if r == 0:
                    outputs[k].append(np.asarray(res.sequences))
                    calls[k][0] += int(np.sum(res.lengths))
                    calls[k][1] += int(np.sum(res.num_target_calls))
    b32, b16 = best["target alone, float32"].sum(), best["target alone, bfloat16"].sum()
    print(
        f"jax {jax.__version__}, {args.size} pair, batch 1, temperature 0, {len(lines)} Multi30k test lines, "
        f"best of {args.repeats}"
    )
    print(
        f"{'decode':32} {'total ms':>9} {'vs f32 alone':>13} {'vs bf16 alone':>14} {'greedy = its target':>20} "
        f"{'tokens/target call':>19}"
    )
    for k, (_, ref) in fns.items():
        same = (
            "" if ref is None else f"{sum(np.array_equal(a, b) for a, b in zip(outputs[k], outputs[ref]))}/{len(lines)}"
        )
        print(
            f"{k:32} {best[k].sum() * 1e3:9.1f} {b32 / best[k].sum():12.3f}x {b16 / best[k].sum():13.3f}x {same:>20} "
            f"{calls[k][0] / max(1, calls[k][1]):19.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

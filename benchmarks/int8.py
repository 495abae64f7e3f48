"""Weight-only int8 (Qwix, ``specjax.quantize``) on the shipped small pair: speed, α, exactness and BLEU.

One process, batch 1, temperature 0, γ ``--gamma``; every variant decodes the same lines, alternating line by line,
each line's best of ``--repeats``. Variants: the target alone in its "auto" dtype (bfloat16 on a CPU with native
bfloat16 dots), in float32 and in int8; speculative sampling with that target and a float32 or int8 draft, and
with the int8 target and an int8 draft. Prints, per variant, the total time, its ratio to the target alone and to
the float32-draft row, α (β summed over verified positions / their count: the paper's §3.1 α), and whether every
greedy output equals its own target's alone (the decode contract: an int8 target's is the int8 target's own).

Then greedy BLEU (sacrebleu, 13a) of the float32 and the int8 target on ``--bleu-lines`` lines of Multi30k test
2016 and of newstest2014 (batches of 32, sorted by length), and the share of lines whose outputs agree.

    python benchmarks/int8.py --num-inputs 24 --bleu-lines 200 > benchmarks/results/int8/YYYY-MM-DD_small_pair.txt
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np
import sacrebleu

import specjax
from specjax.bench.inputs import MULTI30K_TEST, encode_inputs, read_lines
from specjax.hardware import cpu_info

NEWSTEST = "../shared/data/wmt/newstest2014"


def _alpha(res) -> float:
    return float(np.sum(res.beta_sum)) / max(1, int(np.sum(res.num_verified)))


def speed(args, tok, models):
    t_auto, t32, t8, d32, d8 = models
    T = 64
    base = lambda t: lambda x: specjax.temperature_sample(t, x, max_decode_length=T, temperature=0.0)
    spec = lambda t, d: (
        lambda x: specjax.speculative_sample(t, d, x, gamma=args.gamma, max_decode_length=T, temperature=0.0)
    )
    auto = t_auto.config.dtype
    fns = {
        f"target alone, {auto}": (base(t_auto), None),
        "target alone, float32": (base(t32), None),
        "target alone, int8": (base(t8), None),
        f"{auto} target + f32 draft": (spec(t_auto, d32), f"target alone, {auto}"),
        f"{auto} target + int8 draft": (spec(t_auto, d8), f"target alone, {auto}"),
        "int8 target + f32 draft": (spec(t8, d32), "target alone, int8"),
        "int8 target + int8 draft": (spec(t8, d8), "target alone, int8"),
    }
    for name, path in (("Multi30k test 2016", MULTI30K_TEST), ("newstest2014", NEWSTEST + ".en")):
        ids = encode_inputs(tok, read_lines(path, args.num_inputs), "", 64)
        lines = [np.array([r[:64] + [0] * (64 - len(r[:64]))], np.int32) for r in ids]
        for f, _ in fns.values():  # compile
            jax.block_until_ready(f(lines[0]))
        best = {k: np.full(len(lines), np.inf) for k in fns}
        outs = {k: [] for k in fns}
        beta = {k: [0.0, 0] for k in fns}
        for r in range(args.repeats):
            for j, x in enumerate(lines):
                for k, (f, _) in fns.items():
                    t0 = time.perf_counter()
                    res = jax.block_until_ready(f(x))
                    best[k][j] = min(best[k][j], time.perf_counter() - t0)
                    if r == 0:
                        outs[k].append(np.asarray(res.sequences))
                        beta[k][0] += float(np.sum(res.beta_sum))
                        beta[k][1] += int(np.sum(res.num_verified))
        ref_spec = f"{auto} target + f32 draft"
        print(f"\n{name}: {len(lines)} lines, batch 1, temperature 0, γ {args.gamma}, best of {args.repeats}")
        head = f"{'decode':28} {'total ms':>9} {'vs alone':>9} {'vs f32 draft':>13} {'alpha':>6}"
        print(f"{head} {'greedy = its target':>20}")
        for k, (_, ref) in fns.items():
            total = best[k].sum()
            same = (
                "" if ref is None else f"{sum(np.array_equal(a, b) for a, b in zip(outs[k], outs[ref]))}/{len(lines)}"
            )
            alone = best[ref].sum() / total if ref else 1.0
            vs = f"{best[ref_spec].sum() / total:12.3f}x" if ref else ""
            a = f"{beta[k][0] / beta[k][1]:.3f}" if beta[k][1] else ""
            print(f"{k:28} {total * 1e3:9.1f} {alone:8.3f}x {vs:>13} {a:>6} {same:>20}")


def bleu(args, tok, t32, t8):
    for name, base, T in (
        ("Multi30k test 2016", "../shared/data/train/multi30k/test_2016_flickr", 64),
        ("newstest2014", NEWSTEST, 128),
    ):
        src = read_lines(base + ".en", args.bleu_lines)
        ref = read_lines(base + ".de", args.bleu_lines)
        order = sorted(range(len(src)), key=lambda i: len(src[i]))
        hyps = {}
        for label, m in (("float32", t32), ("int8", t8)):
            out = [""] * len(src)
            t0 = time.perf_counter()
            for i in range(0, len(order), 32):
                idx = order[i : i + 32]
                ids = encode_inputs(tok, [src[j] for j in idx], "", 256)
                width = max(len(r) for r in ids)
                x = np.array([r + [0] * (width - len(r)) for r in ids], np.int32)
                res = specjax.temperature_sample(m, x, max_decode_length=T, temperature=0.0)
                for j, row, n in zip(idx, np.asarray(res.sequences), np.asarray(res.lengths)):
                    out[j] = tok.decode([int(t) for t in row[:n] if t > 1])
            hyps[label] = out
            score = sacrebleu.corpus_bleu(out, [ref])
            took = time.perf_counter() - t0
            print(f"{name}, {len(src)} lines, {label} target, greedy: BLEU {score.score:.2f} ({took:.0f} s)")
        agree = sum(a == b for a, b in zip(hyps["float32"], hyps["int8"]))
        print(f"{name}: int8 output equals float32's on {agree}/{len(src)} lines")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--num-inputs", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--bleu-lines", type=int, default=200)
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args(argv)
    info = cpu_info()
    print(f"jax {jax.__version__}, CPU {info.describe()}, load average {os.getloadavg()[0]:.1f} at the start")
    t_auto, d32, tok = specjax.load_default_pair(size="small", dtype="auto", draft_dtype="float32")
    t8, d8, _ = specjax.load_default_pair(size="small", dtype="int8", draft_dtype="int8")
    t32, _, _ = specjax.load_default_pair(size="small", dtype="float32")
    for label, m in (("float32 target", t32), ("int8 target", t8), ("float32 draft", d32), ("int8 draft", d8)):
        nbytes = m.weight_bytes if hasattr(m, "weight_bytes") else sum(x.nbytes for x in jax.tree.leaves(m.params))
        print(f"{label:15} weights {nbytes / 2**20:7.1f} MiB (compute {m.config.dtype})")
    if not args.skip_speed:
        speed(args, tok, (t_auto, t32, t8, d32, d8))
    if args.bleu_lines:
        bleu(args, tok, t32, t8)
    return 0


if __name__ == "__main__":
    sys.exit(main())

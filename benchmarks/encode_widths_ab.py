"""A/B of the run-time encoder width (``specjax.models.adapter.ENCODE_WIDTHS``) on the shipped pair.

Each batch is padded to one width (``--width``, as the bench and the CLI pad to keep one program), and the
same ``temperature_sample`` / ``speculative_sample`` calls run with models that encode the whole padded
width (``T5Decoding(config, encode_widths=())``, before) and with the default widths (after), compiled in this
one process and timed alternately, repeated (best of the repeats). Prints tokens/s, the ratio after / before,
the per-call wall time, and whether the outputs are token-for-token equal. Nothing is asserted.

    python benchmarks/encode_widths_ab.py --lines 32 --gammas 3 --temperatures 0 1 --batch-sizes 1 32

Cited by docs/benchmarks.md ("CPU notes": run-time encoder width); it prints its table on stdout.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np

import specjax
from specjax.models.adapter import T5Decoding

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=32)
    ap.add_argument("--width", type=int, default=64, help="padded encoder width of every batch (tokens)")
    ap.add_argument("--gammas", type=int, nargs="+", default=[3])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-decode-length", type=int, default=64)
    args = ap.parse_args(argv)

    target, draft, tok = specjax.load_default_pair()
    variants = {}
    for name, widths in (("before", ()), ("after", None)):
        pair = []
        for m in (target, draft):
            dm, params = m.decoding_model()
            pair.append((dm if widths is None else T5Decoding(dm.config, widths), params))
        variants[name] = pair
    lines = (DATA / "train/multi30k/test_2016_flickr.en").read_text().splitlines()[: args.lines]
    T, W = args.max_decode_length, args.width
    print(
        f"jax {jax.__version__}, {jax.default_backend()}; {len(lines)} Multi30k test lines padded to {W}; "
        f"max_decode_length {T}; tokens/s best of {args.repeats}; before = whole width, after = run-time width"
    )
    print(
        f"{'b':>3} {'T':>4} {'fn':>9} | {'before tok/s':>12} {'after tok/s':>11} {'after/before':>12} | "
        f"{'ms/call before':>14} {'after':>6} | same"
    )
    for b in args.batch_sizes:
        batches = []
        for i in range(0, len(lines) - b + 1, b):
            x = np.asarray(tok.encode_batch(lines[i : i + b]))[:, :W]
            batches.append(np.pad(x, ((0, 0), (0, W - x.shape[1]))))
        for temp in args.temperatures:
            fns = {
                "baseline": lambda t, d, x: specjax.temperature_sample(
                    t, x, rng=0, max_decode_length=T, temperature=temp
                )
            }
            for g in args.gammas:
                fns[f"spec γ{g}"] = (
                    lambda g: (
                        lambda t, d, x: specjax.speculative_sample(
                            t, d, x, rng=0, gamma=g, max_decode_length=T, temperature=temp
                        )
                    )
                )(g)
            for fname, fn in fns.items():

                def run(name):
                    t, d = variants[name]
                    n, t0, out = 0, time.perf_counter(), []
                    for x in batches:
                        r = fn(t, d, x)
                        out.append(np.asarray(r.sequences))
                        n += int(np.sum(r.lengths))
                    return n / (time.perf_counter() - t0), (time.perf_counter() - t0) / len(batches), out

                best = {}
                for name in variants:  # compile and warm up
                    run(name)
                for _ in range(args.repeats):
                    for name in variants:
                        tps, ms, out = run(name)
                        if tps > best.get(name, (0,))[0]:
                            best[name] = (tps, ms, out)
                same = all(np.array_equal(a, c) for a, c in zip(best["before"][2], best["after"][2]))
                print(
                    f"{b:3d} {temp:4.1f} {fname:>9} | {best['before'][0]:12.0f} {best['after'][0]:11.0f} "
                    f"{best['after'][0] / best['before'][0]:12.2f} | {1e3 * best['before'][1]:14.1f} "
                    f"{1e3 * best['after'][1]:6.1f} | {same}",
                    flush=True,
                )


if __name__ == "__main__":
    main()

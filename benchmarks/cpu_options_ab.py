"""A/B of the CPU compile options (``specjax/decoding/xla_cpu.py``) on the shipped pair, side by side.

For each batch size, temperature and γ: ``temperature_sample`` and ``speculative_sample`` on the same Multi30k
test 2016 lines, each compiled twice in this one process — with the options specjax picks
(``SPECJAX_XLA_CPU_OPTIONS`` unset) and with XLA's defaults (``=0``) — then timed alternately, repeated; the
table gives tokens/s (best of the repeats) and the ratios. Nothing is asserted.

    python benchmarks/cpu_options_ab.py --lines 32 --gammas 3 4 5 --temperatures 0 1 --batch-sizes 1
    python benchmarks/cpu_options_ab.py --size small --dtype bfloat16 --draft-dtype float32 --lines 24 --gammas 5
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import jax
import numpy as np

import specjax

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=32)
    ap.add_argument("--gammas", type=int, nargs="+", default=[3, 4, 5])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-decode-length", type=int, default=64)
    ap.add_argument("--size", default="mini", choices=["mini", "small"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the target's dtype")
    ap.add_argument(
        "--draft-dtype", default=None, choices=["float32", "bfloat16"], help="the draft's dtype (default: --dtype)"
    )
    args = ap.parse_args(argv)

    target, draft, tok = specjax.load_default_pair(size=args.size, dtype=args.dtype, draft_dtype=args.draft_dtype)
    lines = (DATA / "train/multi30k/test_2016_flickr.en").read_text().splitlines()[: args.lines]
    T = args.max_decode_length
    print(
        f"jax {jax.__version__}, {jax.default_backend()}; {len(lines)} Multi30k test lines; "
        f"max_decode_length {T}; tokens/s = emitted tokens / wall seconds (best of {args.repeats})"
    )
    print(
        f"{'b':>3} {'T':>4} {'γ':>2} | {'base dflt':>9} {'base tuned':>10} | {'spec dflt':>9} {'spec tuned':>10} | "
        f"{'spec/base tuned':>15} {'α':>6} {'tok/call':>8}"
    )
    for b in args.batch_sizes:
        width = 48  # every batch padded to one width (as the bench's buckets do): one program per setting
        batches = []
        for i in range(0, len(lines) - b + 1, b):
            x = np.asarray(tok.encode_batch(lines[i : i + b]))[:, :width]
            batches.append(np.pad(x, ((0, 0), (0, width - x.shape[1]))))

        def run(mode, fn):
            os.environ["SPECJAX_XLA_CPU_OPTIONS"] = "1" if mode == "tuned" else "0"
            n, t0, results = 0, time.perf_counter(), []
            for x in batches:
                r = fn(x)
                jax.block_until_ready(r.sequences)
                n += int(np.sum(r.lengths))
                results.append(r)
            return n / (time.perf_counter() - t0), results

        for temp in args.temperatures:
            base = lambda x: specjax.temperature_sample(
                target,
                x,
                rng=0,
                max_decode_length=T,  # noqa: E731
                temperature=temp,
            )
            for g in args.gammas:
                spec = lambda x: specjax.speculative_sample(
                    target,
                    draft,
                    x,
                    rng=0,
                    gamma=g,  # noqa: E731
                    max_decode_length=T,
                    temperature=temp,
                )
                best = {}
                for mode in ("default", "tuned"):  # compile (and warm up) every program first
                    run(mode, base), run(mode, spec)
                for _ in range(args.repeats):
                    for mode in ("default", "tuned"):
                        for name, fn in (("base", base), ("spec", spec)):
                            tps, res = run(mode, fn)
                            key = (name, mode)
                            if tps > best.get(key, (0,))[0]:
                                best[key] = (tps, res)
                sr = best[("spec", "tuned")][1]
                alpha = sum(float(np.sum(r.beta_sum)) for r in sr) / max(
                    1, sum(int(np.sum(r.num_verified)) for r in sr)
                )
                tpc = sum(int(np.sum(r.lengths)) for r in sr) / sum(int(np.sum(r.num_target_calls)) for r in sr)
                print(
                    f"{b:3d} {temp:4.1f} {g:2d} | {best[('base', 'default')][0]:9.0f} {best[('base', 'tuned')][0]:10.0f} | "
                    f"{best[('spec', 'default')][0]:9.0f} {best[('spec', 'tuned')][0]:10.0f} | "
                    f"{best[('spec', 'tuned')][0] / best[('base', 'tuned')][0]:15.2f} {alpha:6.3f} {tpc:8.2f}",
                    flush=True,
                )
    os.environ.pop("SPECJAX_XLA_CPU_OPTIONS", None)


if __name__ == "__main__":
    main()

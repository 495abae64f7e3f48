"""A/B of the decode loops' attention memory dtype for a bfloat16 target (``T5Decoding.kv_dtype``), side by side.

The small pair's target in bfloat16 (the draft in float32) decodes the same Multi30k test 2016 lines with its
self-attention cache and cross-attention keys/values in bfloat16 (``T5Decoding(config)``: before) and in
float32 (what ``T5Model.decoding_model()`` picks on CPU: after), both compiled in this one process and timed
alternately, line by line, best of the repeats. Prints the total time of speculative sampling and of the
bfloat16 target alone each way, the ratios, and how many lines' outputs are token-for-token equal (they
should all be: the memory holds the same values). Nothing is asserted.

    python benchmarks/kv_dtype_ab.py --num-inputs 24 --gamma 5

Cited by docs/benchmarks.md ("CPU notes": attention memory in float32). Output, as committed:
``python benchmarks/kv_dtype_ab.py > benchmarks/results/cpu_kernels/YYYY-MM-DD_kv_dtype_ab.txt``.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

import specjax
from specjax.bench.inputs import MULTI30K_TEST, encode_inputs, read_lines
from specjax.models.adapter import T5Decoding


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-inputs", type=int, default=24, help="Multi30k test 2016 lines (default: 24)")
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    t16, _, tok = specjax.load_default_pair(size="small", dtype="bfloat16")
    _, d32, _ = specjax.load_default_pair(size="small", dtype="float32")
    after, params = t16.decoding_model()
    before = T5Decoding(t16.config)
    ids = encode_inputs(tok, read_lines(MULTI30K_TEST, args.num_inputs), "", 64)
    lines = [np.array([r + [0] * (64 - len(r))], np.int32) for r in ids]
    kw = dict(max_decode_length=64, temperature=0.0)
    fns = {
        "speculative, bfloat16 memory": lambda x: specjax.speculative_sample(
            (before, params), d32, x, gamma=args.gamma, **kw
        ),
        f"speculative, {after.kv_dtype} memory": lambda x: specjax.speculative_sample(
            (after, params), d32, x, gamma=args.gamma, **kw
        ),
        "target alone, bfloat16 memory": lambda x: specjax.temperature_sample((before, params), x, **kw),
        f"target alone, {after.kv_dtype} memory": lambda x: specjax.temperature_sample((after, params), x, **kw),
    }
    best = {k: np.full(len(lines), np.inf) for k in fns}
    outs = {k: [] for k in fns}
    for f in fns.values():
        jax.block_until_ready(f(lines[0]))  # compile
    for r in range(args.repeats):
        for j, x in enumerate(lines):
            for k, f in fns.items():
                t0 = time.perf_counter()
                res = jax.block_until_ready(f(x))
                best[k][j] = min(best[k][j], time.perf_counter() - t0)
                if r == 0:
                    outs[k].append(np.asarray(res.sequences))
    print(
        f"jax {jax.__version__}, small pair, bfloat16 target, float32 draft, batch 1, temperature 0, "
        f"γ {args.gamma}, {len(lines)} Multi30k test lines, best of {args.repeats}"
    )
    names = list(fns)
    for k in names:
        print(f"{k:40} {best[k].sum() * 1e3:9.1f} ms")
    for a, b in (names[0:2], names[2:4]):
        same = sum(np.array_equal(u, v) for u, v in zip(outs[a], outs[b]))
        print(f"{b} / {a}: {best[a].sum() / best[b].sum():.3f}x faster, outputs equal on {same}/{len(lines)} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())

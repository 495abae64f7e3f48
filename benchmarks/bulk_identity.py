"""Greedy bulk output against each line decoded alone: the exactness goal of bulk decoding on real text.

    python benchmarks/bulk_identity.py --lines 1000 --batch 32 --gamma 0 --dtype float32 \\
        --out benchmarks/results/bulk/NAME.md

Decodes the first ``--lines`` lines of newstest2014 (en) greedily through ``specjax.bulk.BulkDecoder`` at
``--batch`` slots (``--gamma``: 0 the target alone, an int, or auto), then each line alone with
``temperature_sample`` at batch 1 (padded to a power of two >= 16, as one slot pads it), and counts the lines whose
tokens are identical. The alone decodes are the reference: no slot, no neighbour, no refill.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "wmt", "newstest2014.en")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=1000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--gamma", default="0")
    p.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--max-decode-length", type=int, default=128)
    p.add_argument("--data", default=DATA)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    import jax

    import specjax
    from specjax import temperature_sample
    from specjax.bulk import BulkDecoder
    from specjax.cli._common import enable_caches
    from specjax.decoding.inputs import bucket_length

    enable_caches()
    target, draft, tok = specjax.load_default_pair(dtype=args.dtype)
    with open(args.data, encoding="utf-8") as f:
        rows = [tok.encode(line) for line in f.read().splitlines()[: args.lines]]
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    t0 = time.perf_counter()
    bulk = BulkDecoder(
        target,
        draft if gamma != 0 else None,
        batch_size=args.batch,
        gamma=gamma,
        max_decode_length=args.max_decode_length,
    )
    got = [r.tokens for r in bulk.generate(rows, temperature=0.0, rng=0, progress=True)]
    bulk_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    differ = []
    for i, row in enumerate(rows):
        x = np.zeros((1, bucket_length(len(row), 512, minimum=16)), np.int32)
        x[0, : len(row)] = row
        r = jax.device_get(
            temperature_sample(
                target, x, rng=jax.random.PRNGKey(0), max_decode_length=args.max_decode_length, temperature=0.0
            )
        )
        alone = r.sequences[0, : int(r.lengths[0])]
        if not np.array_equal(alone, got[i]):
            differ.append(i)
    alone_s = time.perf_counter() - t0
    text = "\n".join(
        [
            f"# Greedy bulk output against each line alone: newstest2014, first {len(rows)} lines, "
            f"{target.config.dtype}",
            "",
            f"Command: `python benchmarks/bulk_identity.py {' '.join(sys.argv[1:])}`; bulk {args.batch} slots, γ "
            f"{args.gamma} (runs by γ {bulk.stats.gammas}); at most {args.max_decode_length} tokens.",
            "",
            f"- identical: {len(rows) - len(differ)} of {len(rows)} lines"
            + (f" (differing: {differ[:20]})" if differ else ""),
            f"- tokens: {sum(len(g) for g in got)}; wall seconds, bulk {bulk_s:.0f}, alone {alone_s:.0f} (machine "
            f"shared, load {os.getloadavg()[0]:.1f} at the end)",
            "",
        ]
    )
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()

"""Where the time of a real decode call goes: a fixed cost per call and a cost per loop iteration.

Runs ``temperature_sample`` and ``speculative_sample`` (each γ given) on single Multi30k test lines at batch 1,
untraced, alternating line by line, best of ``--repeats``; then fits, for each decode function separately,
``call time = fixed + per_iteration × iterations`` by least squares over the lines (iterations = target calls:
one per token for the baseline, one per γ window for speculative sampling). The fixed part is what a call pays
whatever its length (encoders, host dispatch); the per-iteration part is one baseline step or one speculative
iteration (γ draft steps, the verification window, accept and commit). Beside them it prints the isolated
costs of one target step, one (γ + 1)-token window and one draft step (``specjax.bench.timing``'s
``measure_costs``), so ``iteration − window − γ × draft step`` is the loop's own overhead.

Speed is compared only side by side in one process; to compare two versions of the code, run this script
alternately with each on ``PYTHONPATH`` (e.g. a ``git worktree`` of the older commit) and compare the printed
ratios, not the absolute times (``benchmarks/results/loop_overhead.md``).

    python benchmarks/loop_cost.py --size small --gammas 3 5 7 --num-inputs 24
    python benchmarks/loop_cost.py --size small --gammas 3 5 --dtype bfloat16 --draft-dtype float32
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

import specjax
from specjax.bench.inputs import MULTI30K_TEST, encode_inputs, read_lines
from specjax.bench.timing import measure_costs


def fit(times_ms: np.ndarray, iterations: np.ndarray) -> tuple[float, float]:
    """Least squares ``times = fixed + per_iteration × iterations`` -> (fixed ms, per-iteration ms)."""
    a = np.stack([np.ones_like(iterations, dtype=float), iterations.astype(float)], 1)
    (fixed, per_it), *_ = np.linalg.lstsq(a, times_ms, rcond=None)
    return float(fixed), float(per_it)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=["mini", "small"], help="shipped pair (default: small)")
    parser.add_argument("--gammas", type=int, nargs="+", default=[3, 5, 7], help="γ values (default: 3 5 7)")
    parser.add_argument("--temperature", type=float, default=0.0, help="temperature (default: 0, greedy)")
    parser.add_argument("--num-inputs", type=int, default=24, help="Multi30k test lines (default: 24)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes; each line keeps its best (default: 3)")
    parser.add_argument("--width", type=int, default=64, help="inputs padded to this many tokens (default: 64)")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="the target's dtype (default: float32)"
    )
    parser.add_argument(
        "--draft-dtype", default=None, choices=["float32", "bfloat16"], help="the draft's dtype (default: the target's)"
    )
    args = parser.parse_args(argv)

    target, draft, tokenizer = specjax.load_default_pair(size=args.size, dtype=args.dtype, draft_dtype=args.draft_dtype)
    ids = encode_inputs(tokenizer, read_lines(MULTI30K_TEST, args.num_inputs), "", args.width)
    lines = [np.array([row + [0] * (args.width - len(row))], np.int32) for row in ids]
    T, temp = 64, args.temperature
    fns = {"temperature_sample": lambda x: specjax.temperature_sample(target, x, max_decode_length=T, temperature=temp)}
    for g in args.gammas:
        fns[f"speculative γ={g}"] = lambda x, g=g: specjax.speculative_sample(
            target, draft, x, gamma=g, max_decode_length=T, temperature=temp
        )
    for fn in fns.values():  # compile
        jax.block_until_ready(fn(lines[0]))
    best = {k: np.full(len(lines), np.inf) for k in fns}
    iters = {k: np.zeros(len(lines)) for k in fns}
    for _ in range(args.repeats):
        for j, x in enumerate(lines):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                result = jax.block_until_ready(fn(x))
                best[k][j] = min(best[k][j], (time.perf_counter() - t0) * 1e3)
                iters[k][j] = int(np.asarray(result.num_target_calls).sum())

    costs = measure_costs(target, draft, lines[0], args.gammas)
    print(
        f"jax {jax.__version__}, {args.size} pair ({args.dtype} target, {args.draft_dtype or args.dtype} draft), "
        f"batch 1, temperature {temp:g}, {len(lines)} lines, "
        f"best of {args.repeats}"
    )
    windows = ", ".join(f"γ={g} window {w * 1e3:.3f} ms" for g, w in costs["target_window_s"].items())
    print(
        f"isolated (jitted loops of decode calls): target step {costs['target_step_s'] * 1e3:.3f} ms, "
        f"draft step {costs['draft_step_s'] * 1e3:.3f} ms, {windows}"
    )
    base_total = best["temperature_sample"].sum()
    print(f"{'decode':22} {'total ms':>9} {'iterations':>10} {'fixed ms':>9} {'ms/iteration':>12} {'speedup':>8}")
    for k in fns:
        fixed, per_it = fit(best[k], iters[k])
        extra = ""
        if k.startswith("speculative"):
            g = int(k.split("=")[1])
            parts = costs["target_window_s"][g] + g * costs["draft_step_s"]
            extra = f"  (window + γ draft steps {parts * 1e3:.3f} ms: loop overhead {per_it - parts * 1e3:.3f} ms)"
        print(
            f"{k:22} {best[k].sum():9.1f} {int(iters[k].sum()):10d} {fixed:9.2f} {per_it:12.3f} "
            f"{base_total / best[k].sum():8.3f}{extra}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

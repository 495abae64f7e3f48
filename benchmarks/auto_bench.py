"""gamma="auto" against every fixed γ and the target alone, side by side in one process (docs/performance.md).

For each batch size and temperature: the target alone (``temperature_sample``), ``speculative_sample`` at each
fixed γ, and one ``specjax.Decoder(gamma="auto")`` per batch size (kept across temperatures, as a server would
keep it). Every program is compiled before timing (auto: one untimed pass over all batches, which also teaches it
α); then ``--rounds`` passes in which the methods take turns on each batch in a rotating order, so a busier
moment of the machine falls on all of them alike. Reported: tokens/s and the ratio to the target alone and to
the best of (target alone, every fixed γ), and which γ auto ran.

    python benchmarks/auto_bench.py --size small --lines 24 --batch 1 8 --temperature 0 1 \\
        --out benchmarks/results/auto/2026-12-06_<cpu>.md
"""

from __future__ import annotations

import argparse
import collections
import time

import jax
import numpy as np

import specjax
from specjax import bench, hardware, speculative_sample, temperature_sample
from specjax.bench.timing import finish
from specjax.defaults import demo_sentences, pair_dtypes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="small", choices=["mini", "small"])
    p.add_argument("--lines", type=int, default=24)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--temperature", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--gammas", type=int, nargs="+", default=list(range(1, 9)))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-decode-length", type=int, default=64)
    p.add_argument("--out", default=None, help="markdown file to write (default: stdout only)")
    p.add_argument(
        "--float32-baseline",
        action="store_true",
        help="also the float32 target alone (the fastest target alone on a CPU; the auto target may be bfloat16)",
    )
    a = p.parse_args()

    t_dtype, d_dtype, why = pair_dtypes(a.size)
    target, draft, tok = specjax.load_default_pair(size=a.size)
    target32 = specjax.load_default_pair(size=a.size, dtype="float32")[0] if a.float32_baseline else None
    lines, origin = demo_sentences(a.lines)
    rows = [tok.encode(line) for line in lines]
    T = a.max_decode_length
    header = [
        f"# gamma auto vs fixed γ vs the target alone: the {a.size} pair, {len(lines)} lines of {origin}",
        "",
        f"CPU: {hardware.cpu_info().describe()}; jax {jax.__version__}. The machine was loaded (other jobs shared",
        "its 2 cores): only ratios measured side by side in this one run mean anything.",
        f"dtype path (auto): target {t_dtype}, draft {d_dtype} ({why}).",
        f"Every program compiled before timing; {a.rounds} timed passes, methods rotating per batch;",
        f"max_decode_length {T}. `python benchmarks/auto_bench.py " + " ".join(_argv()) + "`",
        "",
        "| batch | temperature | method | tokens/s | vs target alone (auto dtype) | vs best fixed | γ auto ran | α |",
        "|---|---|---|---|---|---|---|---|",
    ]
    out = list(header)
    print("\n".join(header), flush=True)
    for b in a.batch:
        batches = bench.pad_batches(rows, batch_size=b)
        decoder = specjax.Decoder(target, draft, gamma="auto", max_decode_length=T)
        for temp in a.temperature:
            methods = {"target alone": None, **{f"γ {g}": g for g in a.gammas}, "auto": "auto"}
            if target32 is not None:
                methods["float32 target alone"] = "float32"
            ran, excluded = collections.Counter(), collections.Counter()
            alphas = collections.defaultdict(list)

            def call(name, j, x, temp=temp, methods=methods, ran=ran, decoder=decoder, excluded=excluded):
                g = methods[name]
                key = jax.random.PRNGKey(j)
                if g is None or g == "float32":
                    model = target if g is None else target32
                    return finish(temperature_sample(model, x, rng=key, max_decode_length=T, temperature=temp))
                if g == "auto":
                    r = finish(decoder(x, rng=key, temperature=temp))
                    if decoder.last_compiled:  # a γ first picked now: run again, its compile time not charged
                        excluded[name] += decoder.last_seconds
                        r = finish(decoder(x, rng=key, temperature=temp, gamma=decoder.last_choice.gamma))
                    ran[decoder.last_choice.gamma] += 1
                    return r
                return finish(
                    speculative_sample(target, draft, x, rng=key, gamma=g, max_decode_length=T, temperature=temp)
                )

            for name in methods:  # compile (auto: every batch once, teaching α)
                for j, x in enumerate(batches if name == "auto" else batches[:1]):
                    call(name, j, x)
            ran.clear()
            excluded.clear()
            seconds, tokens = collections.Counter(), collections.Counter()
            names = list(methods)
            for rnd in range(a.rounds):
                for j, x in enumerate(batches):
                    shift = (rnd * len(batches) + j) % len(names)
                    for name in names[shift:] + names[:shift]:
                        t0 = time.perf_counter()
                        r = call(name, j, x)
                        seconds[name] += time.perf_counter() - t0
                        tokens[name] += int(np.sum(np.asarray(r.lengths)[: min(b, len(rows) - j * b)]))
                        if not np.isnan(r.acceptance_rate):
                            alphas[name].append(r.acceptance_rate)
            tps = {n: tokens[n] / (seconds[n] - excluded[n]) for n in names}
            base = tps["target alone"]
            best_fixed = max(v for n, v in tps.items() if n != "auto")  # the float32 target alone included
            for n in names:
                auto_ran = ", ".join(f"{g}×{c}" for g, c in sorted(ran.items())) if n == "auto" else ""
                alpha = f"{np.mean(alphas[n]):.3f}" if alphas[n] else ""
                line = (
                    f"| {b} | {temp:g} | {n} | {tps[n]:.1f} | {tps[n] / base:.2f}x | {tps[n] / best_fixed:.2f}x "
                    f"| {auto_ran} | {alpha} |"
                )
                out.append(line)
                print(line, flush=True)
            if decoder.last_choice is not None:
                note = f"<!-- batch {b}, temperature {temp:g}: last choice: {decoder.last_choice.describe()} -->"
                out.append(note)
                print(note, flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write("\n".join(out) + "\n")


def _argv() -> list[str]:
    import sys

    return sys.argv[1:]


if __name__ == "__main__":
    main()

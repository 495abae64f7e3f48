"""Where a bulk decode's time goes: a ``jax.profiler`` trace of the real compiled slot loop (STYLE.md item 16).

    python benchmarks/bulk_profile.py --lines 128 --batch 32 --dtype float32 --out benchmarks/results/bulk/NAME.md

``specjax.bulk.BulkDecoder`` decodes the first ``--lines`` newstest2014 lines (greedy, the target alone by default,
``--gamma``) through ``--batch`` slots once untraced (compiles), then twice: once timed, once under the profiler
(``specjax.bench.profile.profile_calls``). The report gives, per run of the slot loop (``SlotPrograms.run``): the
loop's wall time per iteration and the thunk time per named scope and per HLO op (the 12 costliest, summed over
threads), the other programs a decode runs (the inserts with their encoders, the key folding) per decode, and the
host time left; beside it the FLOPs floor of one iteration at this machine's measured matmul throughput
(``profile.machine_limits``, ``profile.model_costs``).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "wmt", "newstest2014.en")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--gamma", default="0", help="0 (the target alone), an int, or auto")
    p.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--max-decode-length", type=int, default=128)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    import specjax
    from specjax.bench import profile
    from specjax.bulk import BulkDecoder
    from specjax.cli._common import enable_caches
    from specjax.hardware import cpu_info

    enable_caches()
    target, draft, tok = specjax.load_default_pair(dtype=args.dtype)
    with open(DATA, encoding="utf-8") as f:
        rows = [tok.encode(line) for line in f.read().splitlines()[: args.lines]]
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    bulk = BulkDecoder(
        target,
        draft if gamma != 0 else None,
        batch_size=args.batch,
        gamma=gamma,
        max_decode_length=args.max_decode_length,
    )
    tokens = [0]

    def call(_j):
        tokens[0] = sum(len(r.tokens) for r in bulk.generate(rows, temperature=0.0, rng=0))

    prof = profile.profile_calls(call, 1)
    s = bulk.stats
    limits = profile.machine_limits()
    costs = profile.model_costs(target)
    out = [
        f"# Profile of bulk decoding: {args.lines} newstest2014 lines, {args.batch} slots, γ {args.gamma}, "
        f"{target.config.dtype}",
        "",
        f"CPU: {cpu_info().describe()}; load average at the start "
        f"{os.getloadavg()[0]:.1f}. Command: `python benchmarks/bulk_profile.py {' '.join(sys.argv[1:])}`.",
        "",
        f"- one decode of the lines: {prof.call_ms / 1e3:.2f} s untraced ({tokens[0]} tokens, "
        f"{tokens[0] / prof.call_ms * 1e3:.0f} tokens/s), {s.runs} runs of the slot loop, {s.iterations} iterations",
        f"- the slot loop: {prof.iteration_ms:.2f} ms per iteration ({args.batch} slots: "
        f"{prof.iteration_ms / args.batch:.3f} ms per slot-token), {prof.thunks_per_iteration:.0f} thunks per "
        f"iteration; {prof.calls} loop runs traced",
        "- per iteration by scope (thunk ms, summed over threads): "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(prof.scope_ms_per_iteration.items(), key=lambda kv: -kv[1])),
        "- other programs per decode (ms): "
        + ", ".join(f"{k} {v:.0f}" for k, v in sorted(prof.other_programs_ms.items(), key=lambda kv: -kv[1])[:8]),
        f"- host time per decode not in any program: {prof.host_ms:.0f} ms",
        f"- machine: matmul {limits['matmul_gflop_s']:.0f} GFLOP/s, copy {limits['memory_gb_s']:.1f} GB/s; the "
        f"target's decoder FLOPs per token {costs['flops_per_token'] / 1e6:.0f} M: floor "
        f"{costs['flops_per_token'] * args.batch / (limits['matmul_gflop_s'] * 1e9) * 1e3:.2f} ms per iteration of "
        f"{args.batch} slots",
        "",
        "| op (12 costliest in the loop) | scope | ms per iteration | runs per iteration |",
        "|---|---|---|---|",
    ]
    out += [f"| `{op}` | {scope} | {ms:.3f} | {n:.1f} |" for op, scope, ms, n in prof.top_ops]
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()

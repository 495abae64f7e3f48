"""Bulk decoding (``specjax.BulkDecoder``) measured: speed against static batches and CTranslate2, exactness
against each line alone, and where a bulk decode's time goes.

    python benchmarks/bulk.py speed --lines 500 --batch 32 --out benchmarks/results/bulk/NAME.md
    python benchmarks/bulk.py identity --lines 1000 --batch 32 --gamma 0 --dtype float32 --out RESULTS.md
    python benchmarks/bulk.py profile --lines 128 --batch 32 --dtype float32 --out benchmarks/results/bulk/NAME.md

Each subcommand's ``--help`` gives its flags; its docstring below says what it measures. Results:
``benchmarks/results/bulk/`` (docs/benchmarks.md, "Bulk decoding").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from specjax.bench.report import run_subcommands

# ------------------------------------------------------------------------------------------------------------
# speed (formerly benchmarks/bulk_bench.py)

_SPEED_DOC = """\
Bulk decoding against today's static batches and CTranslate2's own bulk API, each engine in its own process.

    python benchmarks/bulk.py speed --lines 500 --batch 32 \\
        --out benchmarks/results/bulk/2026-12-07_amd-epyc-zen4-2core.md   # writes that markdown file

Engines (one process each; the driver starts ``python benchmarks/bulk.py speed --engine NAME ...`` per engine and
reads the JSON line it prints):

- ``bulk``: ``specjax.bulk.BulkDecoder`` (slots refilled, inputs sorted by length in a read-ahead window of 16
  batches; ``--gamma``, default auto) at ``--batch`` slots.
- ``static``: today's static ``generate`` loop: the file cut into batches of ``--batch`` lines in file order, each
  padded to a power-of-two width, decoded by ``temperature_sample`` (γ 0) or ``speculative_sample``
  (``--static-gamma``).
- ``ct2``: CTranslate2 float32 ``translate_iterable`` (its own length sorting, ``max_batch_size``), greedy, the pair's
  target converted by ``specjax.bench.peers.to_ctranslate2``; best of batch sizes ``--ct2-batches`` and of 1 and 2
  threads, and int8 as a reference row.

Each engine decodes the first ``--lines`` lines of newstest2014 (en) greedily, at most ``--max-decode-length``
tokens, twice in its process: the first round includes compilation (its time to the first line is the cold
one), the second is reported (tokens/s, lines/s, time to the first output line); peak RSS is the process's
(``ru_maxrss``). The greedy outputs of bulk and static are compared line by line (float32: identical).
"""


DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "wmt", "newstest2014.en")


def _rows(args):
    import specjax
    from specjax.cli._common import enable_caches

    enable_caches()  # as the specjax command: XLA's persistent compilation cache and the measured costs on disk

    target, draft, tok = specjax.load_default_pair(size=args.size, dtype=args.dtype)
    path = args.data or DATA
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()[: args.lines]
    return target, draft, [tok.encode(line) for line in lines]


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_bulk(args) -> dict:
    from specjax.bulk import BulkDecoder

    target, draft, rows = _rows(args)
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    rounds = []
    for _ in range(2):
        bulk = BulkDecoder(
            target,
            draft if gamma != 0 else None,
            batch_size=args.batch,
            gamma=gamma,
            max_decode_length=args.max_decode_length,
        )
        cpu0 = time.process_time()
        outs = [r.tokens.tolist() for r in bulk.generate(rows, temperature=args.temperature, rng=0)]
        s = bulk.stats
        rounds.append(
            dict(
                cpu=time.process_time() - cpu0,
                seconds=s.seconds,
                tokens=s.tokens,
                lines=s.lines,
                first_line=s.first_line_seconds,
                alpha=s.alpha,
                gammas={str(k): v for k, v in s.gammas.items()},
                reasons=s.reasons,
                runs=s.runs,
            )
        )
    return dict(engine=f"bulk γ {args.gamma}", cold=rounds[0], warm=rounds[1], outputs=outs)


def run_static(args) -> dict:
    import jax

    from specjax import speculative_sample, temperature_sample
    from specjax.decoding.inputs import bucket_length

    target, draft, rows = _rows(args)
    seed = jax.random.PRNGKey(0)
    rounds = []
    for _ in range(2):
        t0, outs, first, tokens, cpu0 = time.perf_counter(), [], None, 0, time.process_time()
        for start in range(0, len(rows), args.batch):
            chunk = rows[start : start + args.batch]
            width = bucket_length(max(len(r) for r in chunk), 512)
            x = np.zeros((args.batch, width), np.int32)
            for j, r in enumerate(chunk):
                x[j, : len(r)] = r
            x[len(chunk) :] = x[0]
            ids = np.arange(start, start + args.batch)
            ids[len(chunk) :] = start
            keys = jax.vmap(lambda i: jax.random.fold_in(seed, i))(ids)
            common = dict(rng=keys, max_decode_length=args.max_decode_length, temperature=args.temperature)
            if args.static_gamma:
                r = speculative_sample(target, draft, x, gamma=args.static_gamma, **common)
            else:
                r = temperature_sample(target, x, **common)
            r = jax.device_get(r)
            for j in range(len(chunk)):
                outs.append(r.sequences[j, : r.lengths[j]].tolist())
                tokens += int(r.lengths[j])
            if first is None:
                first = time.perf_counter() - t0
        seconds = time.perf_counter() - t0
        rounds.append(
            dict(
                cpu=time.process_time() - cpu0,
                seconds=seconds,
                tokens=tokens,
                lines=len(rows),
                first_line=first,
                alpha=None,
            )
        )
    return dict(engine=f"static γ {args.static_gamma}", cold=rounds[0], warm=rounds[1], outputs=outs)


def run_ct2(args) -> dict:
    import ctranslate2

    from specjax.bench.peers import _id_token, to_ctranslate2

    target, _, rows = _rows(args)
    tmp = tempfile.mkdtemp(prefix="bulk_bench_ct2_")
    path = to_ctranslate2(target, tmp)
    src = [[_id_token(int(i)) for i in r] for r in rows]
    best = None
    results = []
    for compute_type in ("float32", "int8"):
        for threads in (1, 2):
            translator = ctranslate2.Translator(path, device="cpu", compute_type=compute_type, intra_threads=threads)
            for batch in args.ct2_batches if compute_type == "float32" else [args.batch]:
                for _round in range(2):
                    t0, first, outs, cpu0 = time.perf_counter(), None, [], time.process_time()
                    for res in translator.translate_iterable(
                        src,
                        max_batch_size=batch,
                        beam_size=1,
                        **(
                            dict(sampling_topk=0, sampling_temperature=args.temperature) if args.temperature > 0 else {}
                        ),
                        max_decoding_length=args.max_decode_length,
                        return_end_token=True,
                    ):
                        if first is None:
                            first = time.perf_counter() - t0
                        outs.append([int(t[3:-1]) for t in res.hypotheses[0]])
                    seconds = time.perf_counter() - t0
                    cpu = time.process_time() - cpu0
                tokens = sum(len(o) for o in outs)
                rec = dict(
                    cpu=cpu,
                    compute_type=compute_type,
                    threads=threads,
                    batch=batch,
                    seconds=seconds,
                    tokens=tokens,
                    lines=len(rows),
                    first_line=first,
                    alpha=None,
                )
                results.append(rec)
                if compute_type == "float32" and (best is None or seconds < best[0]["seconds"]):
                    best = (rec, outs)
    return dict(engine="ctranslate2", warm=best[0], all=results, outputs=best[1])


def _drive(args) -> None:
    engines = []
    for spec in args.engines:  # NAME or NAME:GAMMA
        name, _, gamma = spec.partition(":")
        extra = {"bulk": ["--gamma", gamma or str(args.gamma)], "static": ["--static-gamma", gamma or "0"]}.get(
            name, []
        )
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "speed",
            "--engine",
            name,
            "--lines",
            str(args.lines),
            "--batch",
            str(args.batch),
            "--size",
            args.size,
            "--dtype",
            args.dtype,
            "--max-decode-length",
            str(args.max_decode_length),
            "--temperature",
            str(args.temperature),
        ] + extra
        if args.data:
            cmd += ["--data", args.data]
        print("running:", " ".join(cmd), file=sys.stderr, flush=True)
        engines.append((spec, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        if not args.concurrent:
            engines[-1] = _finish(*engines[-1], args)
    _report(args, [e if isinstance(e, dict) else _finish(*e, args) for e in engines])


def _finish(spec: str, proc, args) -> dict:
    """The JSON an engine process printed (also kept as ``--out``'s name + ``.SPEC.json``)."""
    out, err = proc.communicate()
    if proc.returncode != 0:
        print(err[-4000:], file=sys.stderr)
        raise SystemExit(f"engine {spec} failed")
    result = json.loads(out.strip().splitlines()[-1])
    if args.out:
        with open(f"{args.out}.{spec.replace(':', '_')}.json", "w", encoding="utf-8") as f:
            json.dump(result, f)
    return result


def _report(args, engines) -> None:
    from specjax.hardware import cpu_info

    lines = [
        f"# Bulk decoding: {os.path.basename(args.data or DATA)}, first {args.lines} lines, "
        + ("greedy" if args.temperature == 0 else f"temperature {args.temperature}")
        + f", batch {args.batch}",
        "",
        f"CPU: {cpu_info().describe()}; load average {os.getloadavg()[0]:.1f} at the "
        "end (the machine is shared: compare tokens per CPU-second). Shipped "
        f"{args.size} pair, dtype {args.dtype}, at most {args.max_decode_length} output tokens. Each engine in its "
        "own process; the second of two rounds in the process is reported (the first compiles); peak RSS is the "
        "process's. Command: `python benchmarks/bulk.py speed " + " ".join(sys.argv[1:]) + "`.",
        "",
        "| engine | tokens/s | tokens per CPU-s | lines/s | first line (s) | cold first line (s) | peak RSS (MiB) "
        "| α | "
        "notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in engines:
        w = e["warm"]
        cold = e.get("cold", {}).get("first_line")
        notes = ""
        if "gammas" in w:
            notes = "runs by γ " + ", ".join(f"{k}: {v}" for k, v in w["gammas"].items())
        if e["engine"] == "ctranslate2":
            notes = f"best: {w['compute_type']}, {w['threads']} threads, max_batch_size {w['batch']}"
        alpha = f"{w['alpha']:.3f}" if w.get("alpha") == w.get("alpha") and w.get("alpha") is not None else "–"
        lines.append(
            f"| {e['engine']} | {w['tokens'] / w['seconds']:.0f} | {w['tokens'] / w['cpu']:.0f} | "
            f"{w['lines'] / w['seconds']:.2f} | "
            f"{w['first_line']:.1f} | {cold if cold is None else round(cold, 1)} | {e['rss_mib']:.0f} | {alpha} | "
            f"{notes} |"
        )
    for e in engines:
        for rec in e.get("all", []):
            lines.append(
                f"| ctranslate2 {rec['compute_type']} {rec['threads']}t b{rec['batch']} | "
                f"{rec['tokens'] / rec['seconds']:.0f} | {rec['tokens'] / rec['cpu']:.0f} | "
                f"{rec['lines'] / rec['seconds']:.2f} | {rec['first_line']:.1f} | | | – | |"
            )
    by = {e["engine"]: e["outputs"] for e in engines}
    lines.append("")
    for name, outs in by.items():
        if name.startswith("bulk"):
            for other, o in by.items():
                if other != name:
                    same = sum(a == b for a, b in zip(outs, o))
                    what = "greedy outputs" if args.temperature == 0 else "sampled outputs (not expected equal)"
                    lines.append(f"- {what}, {name} vs {other}: {same} of {len(outs)} lines identical")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)


def speed() -> None:
    p = argparse.ArgumentParser(description=_SPEED_DOC.splitlines()[0])
    p.add_argument("--engine", choices=["bulk", "static", "ct2"], help="run one engine here and print JSON")
    p.add_argument(
        "--engines",
        nargs="+",
        default=["bulk:auto", "bulk:0", "static:0", "static:5", "ct2"],
        help="engines to run, each in its own process: bulk[:GAMMA], static[:GAMMA], ct2",
    )
    p.add_argument("--lines", type=int, default=500)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--gamma", default="auto")
    p.add_argument("--static-gamma", type=int, default=0)
    p.add_argument("--size", default="small", choices=["mini", "small"])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-decode-length", type=int, default=128)
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: greedy (outputs compared line by line); > 0: sampled (CTranslate2 with sampling_topk=0)",
    )
    p.add_argument("--ct2-batches", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--data", default=None, help="input file (default: shared/data/wmt/newstest2014.en)")
    p.add_argument("--out", default=None)
    p.add_argument(
        "--concurrent",
        action="store_true",
        help="start every engine at once (on a machine shared with other jobs each then sees the same load; "
        "compare tokens per CPU-second)",
    )
    args = p.parse_args()
    if args.engine:
        result = {"bulk": run_bulk, "static": run_static, "ct2": run_ct2}[args.engine](args)
        result["rss_mib"] = _rss_mib()
        print(json.dumps(result))
    else:
        _drive(args)


# ------------------------------------------------------------------------------------------------------------
# identity (formerly benchmarks/bulk_identity.py)

_IDENTITY_DOC = """\
Greedy bulk output against each line decoded alone: the exactness goal of bulk decoding on real text.

    python benchmarks/bulk.py identity --lines 1000 --batch 32 --gamma 0 --dtype float32 \\
        --out benchmarks/results/bulk/NAME.md

Decodes the first ``--lines`` lines of newstest2014 (en) greedily through ``specjax.bulk.BulkDecoder`` at
``--batch`` slots (``--gamma``: 0 the target alone, an int, or auto), then each line alone with
``temperature_sample`` at batch 1 (padded to a power of two >= 16, as one slot pads it), and counts the lines whose
tokens are identical. The alone decodes are the reference: no slot, no neighbour, no refill.
"""


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def identity() -> None:
    p = argparse.ArgumentParser(description=_IDENTITY_DOC.splitlines()[0])
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
            f"Command: `python benchmarks/bulk.py identity {' '.join(sys.argv[1:])}`; bulk {args.batch} slots, γ "
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


# ------------------------------------------------------------------------------------------------------------
# profile (formerly benchmarks/bulk_profile.py)

_PROFILE_DOC = """\
Where a bulk decode's time goes: a ``jax.profiler`` trace of the real compiled slot loop (STYLE.md item 16).

    python benchmarks/bulk.py profile --lines 128 --batch 32 --dtype float32 --out benchmarks/results/bulk/NAME.md

``specjax.bulk.BulkDecoder`` decodes the first ``--lines`` newstest2014 lines (greedy, the target alone by default,
``--gamma``) through ``--batch`` slots once untraced (compiles), then twice: once timed, once under the profiler
(``specjax.bench.profile.profile_calls``). The report gives, per run of the slot loop (``SlotPrograms.run``): the
loop's wall time per iteration and the thunk time per named scope and per HLO op (the 12 costliest, summed over
threads), the other programs a decode runs (the inserts with their encoders, the key folding) per decode, and the
host time left; beside it the FLOPs floor of one iteration at this machine's measured matmul throughput
(``profile.machine_limits``, ``profile.model_costs``).
"""


def profile() -> None:
    p = argparse.ArgumentParser(description=_PROFILE_DOC.splitlines()[0])
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
        f"{os.getloadavg()[0]:.1f}. Command: `python benchmarks/bulk.py profile {' '.join(sys.argv[1:])}`.",
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
        "| op (12 costliest in the loop) | scope | JAX source (op_name) | ms per iteration | runs per iteration |",
        "|---|---|---|---|---|",
    ]
    src = prof.op_sources
    out += [f"| `{op}` | {scope} | `{src.get(op, '')}` | {ms:.3f} | {n:.1f} |" for op, scope, ms, n in prof.top_ops]
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)


SUBCOMMANDS = {
    "speed": (speed, _SPEED_DOC),
    "identity": (identity, _IDENTITY_DOC),
    "profile": (profile, _PROFILE_DOC),
}


def main() -> int:
    """``python benchmarks/NAME.py SUBCOMMAND [flags]``: runs SUBCOMMAND with the flags its ``--help`` lists."""
    return run_subcommands(__doc__, SUBCOMMANDS)


if __name__ == "__main__":
    sys.exit(main())

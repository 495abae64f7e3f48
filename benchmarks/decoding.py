"""Decoding speed on a shipped pair, side by side in one process: the dtype paths, γ auto against fixed γ, the
drafting variants, multi-draft.

    python benchmarks/decoding.py dtypes --size small --gammas 4 5 6 7 --drafts float32 --num-inputs 24
    python benchmarks/decoding.py auto --size small --lines 24 --batch 1 8 --temperature 0 1
    python benchmarks/decoding.py variants --out benchmarks/results/drafting_variants/NAME.md
    python benchmarks/decoding.py multi-draft --num-lines 200 --cpu-name "..." --out RESULTS.md

Every method of a comparison is compiled first and the methods are timed in turns on the same inputs, so only the
ratios printed side by side mean anything on a shared machine. The paper's Table 2 (theory against measurement,
many γ and tasks) is ``specjax bench`` (docs/benchmarks.md); window invariance on 1,000 lines is
``benchmarks/window_invariance.py``. Each subcommand's ``--help`` gives its flags.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np
import sacrebleu

import specjax
from specjax import bench, hardware, speculative_sample, temperature_sample
from specjax.bench.inputs import MULTI30K_TEST, encode_inputs, read_lines
from specjax.bench.report import run_subcommands
from specjax.bench.timing import finish
from specjax.decoding import inputs
from specjax.defaults import demo_sentences, pair_dtypes
from specjax.hardware import cpu_info

# ------------------------------------------------------------------------------------------------------------
# dtypes (formerly benchmarks/dtype_loops.py)

_DTYPES_DOC = """\
The small (or mini) pair's decode loops by dtype on this CPU: target alone in float32 and in bfloat16, and
speculative sampling with a bfloat16 or float32 target and a bfloat16 or float32 draft, side by side in one
process (alternating line by line, each line's best of ``--repeats``).

Prints each variant's total time over the lines and its ratio to both baselines, and checks that every greedy
speculative output equals the greedy target's of the same dtype (the decode contract; a float32 and a bfloat16
target may differ from each other). The compile options are the library's own (``specjax/decoding/xla_cpu.py``):
what a user gets.

    python benchmarks/decoding.py dtypes --size small --gammas 3 5 7 --num-inputs 24
    python benchmarks/decoding.py dtypes --gammas 5 6 7 --drafts float32 --extra-drafts d2=/work/runs/d2_export

``--extra-drafts NAME=DIR``: more drafts (any checkpoint ``specjax.load_checkpoint`` reads, run in float32)
beside the shipped one, each with the bfloat16 target, e.g. a draft of another depth before it ships. The last
column, tokens per target call (output tokens over target calls, summed over the lines), is what each draft
buys; its cost per call is what the total time adds.

Cited by README.md and docs/benchmarks.md (the small pair's headline speedup). Output, as committed:
``python benchmarks/decoding.py dtypes --num-inputs 24 --gammas 4 5 6 7 --drafts float32 >
benchmarks/results/small_pair/YYYY-MM-DD_dtype_loops_N.txt``.
"""


def dtypes(argv=None) -> int:
    ap = argparse.ArgumentParser(description=_DTYPES_DOC.split("\n\n")[0])
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


# ------------------------------------------------------------------------------------------------------------
# auto (formerly benchmarks/auto_bench.py)

_AUTO_DOC = """\
gamma="auto" against every fixed γ and the target alone, side by side in one process (docs/performance.md).

For each batch size and temperature: the target alone (``temperature_sample``), ``speculative_sample`` at each
fixed γ, and one ``specjax.Decoder(gamma="auto")`` per batch size (kept across temperatures, as a server would
keep it). Every program is compiled before timing (auto: one untimed pass over all batches, which also teaches it
α); then ``--rounds`` passes in which the methods take turns on each batch in a rotating order, so a busier
moment of the machine falls on all of them alike. Reported: tokens/s and the ratio to the target alone and to
the best of (target alone, every fixed γ), and which γ auto ran.

    python benchmarks/decoding.py auto --size small --lines 24 --batch 1 8 --temperature 0 1 \\
        --out benchmarks/results/auto/2026-12-06_<cpu>.md
"""


def auto() -> None:
    p = argparse.ArgumentParser(description=_AUTO_DOC.splitlines()[0])
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
        f"max_decode_length {T}. `python benchmarks/decoding.py auto " + " ".join(_auto_argv()) + "`",
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


def _auto_argv() -> list[str]:
    import sys

    return sys.argv[1:]


# ------------------------------------------------------------------------------------------------------------
# variants (formerly benchmarks/drafting_variants.py)

_VARIANTS_MAIN_DOC = """\
The drafting variants measured on a shipped pair: token vs block verification, confidence-stopped drafting vs
fixed γ, prompt lookup (no draft model), each against temperature_sample on the same inputs, side by side.

Every variant of a (task, batch size, temperature) group is compiled first, then all variants and the baseline
run alternately over the same batches, ``--repeats`` times; the table gives the best pass of each (tokens/s),
its speedup over the baseline's best pass, tokens per target call and the paper's α (mean of β over verified
positions, accumulated in the loop). Nothing is asserted; the machine is shared, so only ratios within a group
mean anything.

    python benchmarks/decoding.py variants --out benchmarks/results/drafting_variants/YYYY-MM-DD_multi30k.md

Cited by docs/benchmarks.md ("Drafting variants"). Output: the ``--out`` table,
``benchmarks/results/drafting_variants/YYYY-MM-DD_multi30k.md`` (and ``_other.md`` for the other tasks).
"""


DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


TASKS = {  # name: (input file, lines, max_decode_length, max_input_length)
    "multi30k": ("train/multi30k/test_2016_flickr.en", 32, 64, 64),
    "newstest2014": ("wmt/newstest2014.en", 24, 96, 128),
    "cnndm": ("cnndm/cnndm_test_frank250.source", 8, 64, 512),
}


def variants(gammas, thresholds, lookup_gamma):
    out = []
    for g in gammas:
        out.append((f"token γ={g}", dict(gamma=g)))
        out.append((f"block γ={g}", dict(gamma=g, verification="block")))
    for c in thresholds:
        out.append((f"confidence {c} γ≤{max(gammas)}", dict(gamma=max(gammas), draft_confidence_threshold=c)))
    out.append((f"prompt lookup γ={lookup_gamma}", dict(gamma=lookup_gamma, draft="lookup")))
    return out


def variants_main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=_VARIANTS_MAIN_DOC.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--gammas", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.5])
    ap.add_argument("--lookup-gamma", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--size", choices=["mini", "small"], default="mini", help="which shipped pair (cited: mini)")
    args = ap.parse_args(argv)

    target, draft, tok = specjax.load_default_pair(size=args.size)
    lookup = specjax.PromptLookupDraft(max_ngram=3)
    lines_out = [
        f"jax {jax.__version__} {jax.default_backend()}; shipped mini pair (distilled draft); best of "
        f"{args.repeats} passes, all variants alternating in one process",
        "",
        "| task | batch | temp | variant | tokens/s | speedup | tokens/call | α |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines_out), flush=True)
    for task in args.tasks:
        path, n, T, max_in = TASKS[task]
        text = (DATA / path).read_text(encoding="utf-8").splitlines()[:n]
        ids = [r[: max_in - 1] + [tok.eos_id] if len(r) > max_in else r for r in (tok.encode(t) for t in text)]
        for b in args.batch_sizes:
            xs = inputs.batches(ids, batch_size=b, length=inputs.bucket_length(max(len(r) for r in ids)))
            for temp in args.temperatures:
                runs = {
                    "baseline": lambda j, x: specjax.temperature_sample(
                        target, x, rng=jax.random.PRNGKey(j), max_decode_length=T, temperature=temp
                    )
                }
                for name, kw in variants(args.gammas, args.thresholds, args.lookup_gamma):
                    kw = dict(kw)
                    d = lookup if kw.pop("draft", None) == "lookup" else draft
                    runs[name] = (
                        lambda d, kw: (
                            lambda j, x: specjax.speculative_sample(
                                target, d, x, rng=jax.random.PRNGKey(j), max_decode_length=T, temperature=temp, **kw
                            )
                        )
                    )(d, kw)
                for fn in runs.values():  # compile every program first
                    jax.block_until_ready(fn(0, xs[0]).sequences)
                best = {}
                for _ in range(args.repeats):
                    for name, fn in runs.items():
                        t0, res = time.perf_counter(), []
                        for j, x in enumerate(xs):
                            r = fn(j, x)
                            jax.block_until_ready(r.sequences)
                            res.append(jax.device_get(r))
                        dt = time.perf_counter() - t0
                        tokens = sum(int(np.sum(r.lengths)) for r in res)
                        if name not in best or dt < best[name][0]:
                            best[name] = (dt, tokens, res)
                base_dt = best["baseline"][0]
                for name, (dt, tokens, res) in best.items():
                    calls = sum(int(np.sum(r.num_target_calls)) for r in res)
                    verified = sum(int(np.sum(r.num_verified)) for r in res)
                    alpha = sum(float(np.sum(r.beta_sum)) for r in res) / verified if verified else float("nan")
                    line = (
                        f"| {task} | {b} | {temp:g} | {name} | {tokens / dt:.0f} | {base_dt / dt:.2f}x | "
                        f"{tokens / calls:.2f} | {alpha:.3f} |"
                    )
                    lines_out.append(line)
                    print(line, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines_out) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------------------
# multi-draft (formerly benchmarks/multi_draft.py)

_MULTI_DRAFT_DOC = """\
Multi-draft speculative sampling on the shipped small pair: tokens per target call and wall-clock tokens/s for
``num_drafts`` k = 1, 2, 4 at γ 3 and 5, temperatures 0 and 1, on newstest2014 (English → German).

Usage (from the repository root, data in ../shared/data):
  python benchmarks/decoding.py multi-draft --num-lines 200 \
      --cpu-name "2-core AMD EPYC Zen 4, AVX-512 + AVX512_BF16, shared" \
      --out benchmarks/results/multi_draft/2026-12-07_amd-epyc-zen4-avx512bf16.md

Greedy identity (float32 pair, where a window and a one-token step round alike):
  python benchmarks/decoding.py multi-draft --greedy-identity 1000 --cpu-name "..." \
      --out benchmarks/results/multi_draft/2026-12-07_greedy_identity.md
decodes the first 1000 lines with the target alone at temperature 0 and with k = 2 and 4 (γ 3, token rule) and
counts the rows equal token for token.

Cited by docs/architecture.md (the multi-draft step) and CHANGELOG.md. For each (γ, temperature, k) the first
``--num-lines`` lines of newstest2014.en (truncated to 96 tokens) are decoded in batches of ``--batch-size``
(sorted by length, so a batch's rows have similar lengths) with ``speculative_sample(..., num_drafts=k)``; every
k's program is compiled before timing, and each batch is decoded with every k back to back, so a busy moment of
a shared machine slows them alike. Reported: tokens per target
call (Σ lengths / Σ target calls: a property of the models and the rule, not of the machine), its ratio to k = 1
at the same γ and temperature, the share of iterations that kept a branch other than the draft's first choice,
the paper's α at the branch point's first candidate, and tokens/s (wall clock, this machine). At temperature 0
the rows equal to k = 1's output token for token are counted (both are target-greedy: a branch window, a chain
window and a one-token step give the same logits bit for bit, ``tests/test_window_invariance.py``).
"""


def run_multi_draft(target, draft, batches, gamma, temperature, ks, max_len):
    """{k: (tokens per target call, later-branch share, alpha, tokens/s, sequences per batch)}.

    Every k's program is compiled first; then each batch is decoded with every k back to back (the same seed), so
    a busy moment of the shared machine slows every k alike."""
    kwargs = dict(gamma=gamma, max_decode_length=max_len, temperature=temperature)
    for k in ks:  # compile
        jax.block_until_ready(specjax.speculative_sample(target, draft, batches[0], rng=0, num_drafts=k, **kwargs))
    stats = {k: dict(tokens=0, calls=0, later=0, beta=0.0, verified=0.0, seconds=0.0, outputs=[]) for k in ks}
    for j, x in enumerate(batches):
        for k in ks:
            start = time.perf_counter()
            out = specjax.speculative_sample(target, draft, x, rng=jax.random.PRNGKey(j), num_drafts=k, **kwargs)
            out = jax.device_get(out)
            st = stats[k]
            st["seconds"] += time.perf_counter() - start
            st["tokens"] += int(np.sum(out.lengths))
            st["calls"] += int(np.sum(out.num_target_calls))
            st["later"] += int(np.sum(out.accepted_per_branch[:, 1:]))
            st["beta"] += float(np.sum(out.beta_sum))
            st["verified"] += float(np.sum(out.num_verified))
            st["outputs"].append(np.asarray(out.sequences))
    return {
        k: (
            st["tokens"] / st["calls"],
            st["later"] / st["calls"],
            st["beta"] / st["verified"],
            st["tokens"] / st["seconds"],
            st["outputs"],
        )
        for k, st in stats.items()
    }


def multi_draft():
    p = argparse.ArgumentParser(description=_MULTI_DRAFT_DOC.splitlines()[0])
    p.add_argument("--num-lines", type=int, default=200, help="newstest2014 lines (default: 200)")
    p.add_argument("--batch-size", type=int, default=8, help="rows per call (default: 8)")
    p.add_argument("--gammas", type=int, nargs="+", default=[3, 5])
    p.add_argument("--drafts", type=int, nargs="+", default=[1, 2, 4], help="num_drafts values (default: 1 2 4)")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--max-decode-length", type=int, default=128)
    p.add_argument("--cpu-name", required=True, help="the machine, in words (model, vector features, shared?)")
    p.add_argument("--out", required=True, help="markdown file to write")
    p.add_argument("--greedy-identity", type=int, default=0, help="only check greedy identity on this many lines")
    a = p.parse_args()
    if a.greedy_identity:
        return greedy_identity(a)

    target, draft, tok = specjax.load_default_pair(size="small")
    lines = pathlib.Path("../shared/data/wmt/newstest2014.en").read_text(encoding="utf-8").splitlines()[: a.num_lines]
    encoded = sorted((tok.encode(s)[:96] for s in lines), key=len)
    batches = bench.pad_batches(encoded, batch_size=a.batch_size)
    rows = []
    for gamma in a.gammas:
        for temperature in a.temperatures:
            results = run_multi_draft(target, draft, batches, gamma, temperature, a.drafts, a.max_decode_length)
            base_tpc, base_out = None, None
            for k in a.drafts:
                tpc, later, alpha, tps, outs = results[k]
                same = ""
                if temperature == 0:
                    if base_out is None:
                        base_out = outs
                    equal = sum(int(np.array_equal(r, s)) for x, y in zip(outs, base_out) for r, s in zip(x, y))
                    same = f"{equal}/{sum(len(x) for x in outs)}"
                base_tpc = tpc if base_tpc is None else base_tpc
                rows.append((gamma, temperature, k, tpc, tpc / base_tpc, later, alpha, tps, same))
                print(rows[-1], flush=True)

    text = [
        "# Multi-draft speculative sampling: tokens per target call and tokens/s, small pair, newstest2014",
        "",
        f"Machine: {a.cpu_name} ({platform.machine()}, jax {jax.__version__}, backend {jax.default_backend()}).",
        f"Pair: `specjax.load_default_pair(size='small')` (target 46.0M, distilled draft 4.28M parameters; dtypes "
        f"target {target.config.dtype}, draft {draft.config.dtype}). Data: the first {a.num_lines} lines of "
        f"newstest2014.en (inputs cut at 96 tokens), batch {a.batch_size} sorted by length, "
        f"max_decode_length {a.max_decode_length}, token verification, seeds 0..{len(batches) - 1} per batch.",
        "Command: `python benchmarks/decoding.py multi-draft " + " ".join(_quoted_argv()) + "`",
        "",
        "| γ | temperature | k | tokens / target call | × k = 1 | later branch kept | α (first candidate) "
        "| tokens/s (wall) | rows equal to k = 1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for gamma, temperature, k, tpc, ratio, later, alpha, tps, same in rows:
        text.append(
            f"| {gamma} | {temperature:g} | {k} | {tpc:.3f} | {ratio:.3f} | {later:.3f} | {alpha:.3f} | {tps:.1f} "
            f"| {same or '—'} |"
        )
    text += [
        "",
        "Tokens per target call do not depend on the machine; tokens/s do, and the machine was shared with other "
        "jobs (several runs at once on its 2 cores): each batch ran with every k back to back, so the k compare within "
        "a row group, but the absolute figures are this loaded machine's.",
        "",
    ]
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text), encoding="utf-8")
    print("wrote", out)


def greedy_identity(a):
    """Rows of k = 2 and 4 (γ 3) equal to the target alone at temperature 0, float32 small pair."""
    target, draft, tok = specjax.load_default_pair(size="small", dtype="float32")
    path = pathlib.Path("../shared/data/wmt/newstest2014.en")
    lines = path.read_text(encoding="utf-8").splitlines()[: a.greedy_identity]
    batches = bench.pad_batches(sorted((tok.encode(s)[:96] for s in lines), key=len), batch_size=16)
    rows = len(lines)
    equal = {2: 0, 4: 0}
    for x in batches:
        n = min(len(x), rows)
        rows -= n
        base = np.asarray(
            specjax.temperature_sample(
                target, x, rng=0, max_decode_length=a.max_decode_length, temperature=0.0
            ).sequences
        )
        for k in equal:
            out = specjax.speculative_sample(
                target, draft, x, rng=0, gamma=3, max_decode_length=a.max_decode_length, temperature=0.0, num_drafts=k
            )
            equal[k] += int(np.all(np.asarray(out.sequences)[:n] == base[:n], axis=1).sum())
        print(equal, flush=True)
    text = [
        "# Multi-draft greedy identity, small pair in float32, newstest2014",
        "",
        f"Machine: {a.cpu_name}. The first {a.greedy_identity} lines of newstest2014.en (cut at 96 tokens), batch 16 "
        f"sorted by length, max_decode_length {a.max_decode_length}, γ 3, token rule, temperature 0.",
        "Command: `python benchmarks/decoding.py multi-draft " + " ".join(_quoted_argv()) + "`",
        "",
        "| num_drafts | rows equal to the target alone, token for token |",
        "|---|---|",
    ]
    text += [f"| {k} | {v} / {a.greedy_identity} |" for k, v in equal.items()]
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text) + "\n", encoding="utf-8")
    print("wrote", out)


# ------------------------------------------------------------------------------------------------------------
# int8 (weight-only int8 with Qwix: speed, alpha, exactness, BLEU)

_INT8_DOC = """Weight-only int8 (Qwix, ``specjax.quantize``) on the shipped small pair: speed, α, exactness and BLEU.

One process, batch 1, temperature 0, γ ``--gamma``; every variant decodes the same lines, alternating line by line,
each line's best of ``--repeats``. Variants: the target alone in its "auto" dtype (bfloat16 on a CPU with native
bfloat16 dots), in float32 and in int8; speculative sampling with that target and a float32 or int8 draft, and
with the int8 target and an int8 draft. Prints, per variant, the total time, its ratio to the target alone and to
the float32-draft row, α (β summed over verified positions / their count: the paper's §3.1 α), and whether every
greedy output equals its own target's alone (the decode contract: an int8 target's is the int8 target's own).

Then greedy BLEU (sacrebleu, 13a) of the float32 and the int8 target on ``--bleu-lines`` lines of Multi30k test
2016 and of newstest2014 (batches of 32, sorted by length), and the share of lines whose outputs agree.

    python benchmarks/decoding.py int8 --num-inputs 24 --bleu-lines 200 > benchmarks/results/int8/RESULT.txt
"""


NEWSTEST = "../shared/data/wmt/newstest2014"


def _int8_alpha(res) -> float:
    return float(np.sum(res.beta_sum)) / max(1, int(np.sum(res.num_verified)))


def int8_speed(args, tok, models):
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


def int8_bleu(args, tok, t32, t8):
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


def int8(argv=None) -> int:
    ap = argparse.ArgumentParser(description=_INT8_DOC.strip().splitlines()[0])
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
        int8_speed(args, tok, (t_auto, t32, t8, d32, d8))
    if args.bleu_lines:
        int8_bleu(args, tok, t32, t8)
    return 0


def _quoted_argv():
    import sys

    return [f'"{x}"' if " " in x else x for x in sys.argv[1:]]


SUBCOMMANDS = {
    "dtypes": (dtypes, _DTYPES_DOC),
    "auto": (auto, _AUTO_DOC),
    "variants": (variants_main, _VARIANTS_MAIN_DOC),
    "multi-draft": (multi_draft, _MULTI_DRAFT_DOC),
    "int8": (int8, _INT8_DOC),
}


def main() -> int:
    """``python benchmarks/NAME.py SUBCOMMAND [flags]``: runs SUBCOMMAND with the flags its ``--help`` lists."""
    return run_subcommands(__doc__, SUBCOMMANDS)


if __name__ == "__main__":
    sys.exit(main())

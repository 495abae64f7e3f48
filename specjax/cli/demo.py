"""``specjax demo``: the embedded default pair translating real English, with the measured speedup."""

from __future__ import annotations

import argparse
import sys

from specjax.cli import SHIPPED_PAIR_DOMAIN, add_size_arg, gamma_arg


def add_parser(sub) -> None:
    """Registers ``specjax demo``."""
    from specjax.defaults import DECODE_DEFAULTS as D

    p = sub.add_parser(
        "demo",
        help="translate English->German with the shipped pair; print alpha and the measured speedup",
        description="Runs speculative sampling with the embedded draft/target pair on real English "
        "sentences (Multi30k test 2016 when ../shared/data is present, else sentences shipped "
        "with the package), prints each translation, the acceptance rate, tokens per target "
        "call and the speedup over temperature_sample measured in the same run (batch 1, "
        "after compilation). " + SHIPPED_PAIR_DOMAIN,
    )
    p.add_argument("--num-lines", type=int, default=24, help="sentences to translate (default 24)")
    p.add_argument(
        "--gamma",
        type=gamma_arg,
        default=D.gamma,
        help="draft tokens per target call: 'auto' (the default: chosen per line from measured costs and the "
        "running alpha, specjax.Decoder; 0 when the target alone is faster), 0 (the target alone) or an int",
    )
    p.add_argument("--verbose", action="store_true", help="print the gamma choice of every line and its reason")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["auto", "float32", "bfloat16", "int8"],
        help="the target's compute dtype, for both decodes (int8: Qwix weight-only int8, computed in auto's "
        "dtype; default auto: bfloat16 for the small target "
        "only on a CPU with native bfloat16 dots, avx512_bf16 / amx_bf16, else float32; "
        "specjax.defaults.pair_dtypes)",
    )
    p.add_argument(
        "--draft-dtype",
        default=None,
        choices=["auto", "float32", "bfloat16", "int8"],
        help="the draft's compute dtype (int8: Qwix weight-only, exact as any draft; default: with --dtype auto, "
        "the pair's path for this CPU; else --dtype)",
    )
    p.add_argument("--temperature", type=float, default=D.temperature, help="0 = greedy (default)")
    p.add_argument(
        "--draft",
        default="distilled",
        choices=["distilled", "reference"],
        help="which shipped draft: distilled (DistillSpec, default) or reference (trained on the "
        "reference translations)",
    )
    add_size_arg(p)
    length = D.max_decode_length["translation"]
    p.add_argument(
        "--max-decode-length", type=int, default=length, help=f"output tokens per line at most (default {length})"
    )
    p.add_argument(
        "--seed", type=int, default=D.seed, help=f"PRNG seed for sampling at temperature > 0 (default {D.seed})"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Runs the demo; returns 0. Raises ValueError for bad flags before loading any model."""
    from specjax.defaults import default_size, pair_dtypes

    size = args.size or default_size()
    dtype, draft_dtype, why = pair_dtypes(size, args.dtype or "auto", args.draft_dtype or "auto")
    for name in ("num_lines", "max_decode_length"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature} (0 = greedy).")
    import numpy as np
    from tqdm.auto import tqdm

    from specjax import bench, hardware
    from specjax.defaults import DEMO_GAMMA, demo_sentences, load_default_pair

    print(SHIPPED_PAIR_DOMAIN, file=sys.stderr)  # first: what the pair suits, before a minute of work
    print(
        f"dtype path: {why}" if "CPU" in why else f"machine: {hardware.cpu_info().describe()}; {why}", file=sys.stderr
    )
    target, draft, tokenizer = load_default_pair(args.draft, size=args.size, dtype=dtype, draft_dtype=draft_dtype)
    lines, origin = demo_sentences(args.num_lines)
    print(
        f"target: {target.config.name} ({target.num_params / 1e6:.1f}M params, {dtype}), "
        f"draft: {draft.config.name} ({draft.num_params / 1e6:.2f}M params, {args.draft}, {draft_dtype}); "
        f"{len(lines)} lines of {origin}",
        file=sys.stderr,
    )
    batches = bench.pad_batches([tokenizer.encode(l) for l in lines], batch_size=1)
    from specjax.hardware import cache_dir

    kept = cache_dir()
    from specjax.decoding import stored

    where = f" (kept in {kept}: a later run loads them)" if kept is not None else ""
    events_before = len(stored.events())
    known = False
    if args.gamma == "auto":  # γ auto's costs on disk from an earlier run: it chooses at once (measure_pair)
        from specjax.decoder import Decoder

        known = Decoder(target, draft, gamma="auto", max_decode_length=args.max_decode_length).costs_known(batches[0])
    if args.gamma == "auto" and not known:
        first = (
            f"building or loading the decode programs{where}; each translation is printed as it comes (at gamma "
            f"{DEMO_GAMMA[size]} while gamma auto has no measured costs for this CPU: it measures them next), then "
            "both methods are timed..."
        )
    elif args.gamma == "auto":
        first = (
            f"building or loading the decode programs{where}; each translation is printed as it comes (gamma auto, "
            "from the "
            "costs measured on this CPU before), then both methods are timed..."
        )
    else:
        first = (
            f"building or loading both decode programs{where}; each translation is printed as it comes, then both "
            "are timed..."
        )
    print(first, file=sys.stderr)
    bar = None

    def on_batch():
        nonlocal bar
        if bar is None:  # the timed passes: after every translation was printed
            bar = tqdm(total=len(batches), desc="timing speculative vs baseline", unit="line", file=sys.stderr)
        bar.update(1)

    def on_output(j, result):
        n = int(result.lengths[0])
        print(f"EN: {lines[j]}\nDE: {tokenizer.decode(result.sequences[0][:n])}\n", flush=True)
        if j == len(batches) - 1 and args.gamma == "auto" and not known:  # what the next silent minute is
            print(
                "measuring gamma auto's costs on this CPU (once: kept for later runs), then timing both methods...",
                file=sys.stderr,
                flush=True,
            )

    try:
        m = bench.measure_pair(
            target,
            draft,
            batches,
            gamma=args.gamma,
            temperature=args.temperature,
            max_decode_length=args.max_decode_length,
            seed=args.seed,
            on_batch=on_batch,
            on_output=on_output,
            first_pass_gamma=DEMO_GAMMA[size] if args.gamma == "auto" else None,
        )
    finally:
        if bar is not None:
            bar.close()
    chosen = ""
    if m.gammas is not None:
        counts = {g: m.gammas.count(g) for g in sorted(set(m.gammas))}
        chosen = " (auto: " + ", ".join(f"{'target alone' if g == 0 else f'γ {g}'} on {n}" for g, n in counts.items())
        chosen += " lines)"
        if args.verbose:
            print(m.decoder.last_choice.describe(), file=sys.stderr)
    equal = [np.array_equal(a, b) for a, b in zip(m.sequences("spec"), m.sequences("base"))]
    same = all(equal)
    print(
        f"acceptance rate alpha      {m.acceptance_rate:.3f}  (the paper's alpha: mean of beta = sum min(p, q) "
        f"over verified positions; gamma={args.gamma}{chosen}, temperature={args.temperature:g})"
    )
    print(f"accepted / drafted         {m.accepted_fraction:.3f}")
    print(f"tokens per target call     {m.tokens_per_target_call:.2f}")
    print(f"speculative_sample         {m.output_tokens / m.spec_seconds:8.1f} tokens/s")
    print(f"temperature_sample         {m.output_tokens / m.base_seconds:8.1f} tokens/s (target alone)")
    programs = stored.events(events_before)
    built = sum(1 for e in programs if e.how != "loaded")
    print(
        f"speedup                    {m.speedup:.2f}x  (same inputs, batch 1, after compilation; first calls "
        f"{m.spec_compile_seconds:.1f}s + {m.base_compile_seconds:.1f}s not counted: {built} programs built, "
        f"{len(programs) - built} loaded)"
    )
    if args.gamma == "auto":
        print(
            f"not timed either: the first pass over the lines at gamma {m.first_pass_gamma} {m.warmup_seconds:.1f}s "
            f"(the translations above; gamma auto learns alpha from it) and gamma auto's cost measurement "
            f"{m.calibration_seconds:.1f}s (once per machine and shape: kept between runs unless --no-cache)"
        )
    if args.temperature == 0:
        print(
            f"greedy outputs identical to the target alone: {same}"
            + (
                ""
                if same
                else f" ({sum(equal)} of {len(equal)} lines: a defect, please report it with this output; "
                "windows and steps are meant to give the same logits bit for bit)"
            )
        )
    if m.speedup < 1.05:
        hint = (
            "a target whose weights fit the CPU's cache (the mini pair's) wins little from speculative sampling; "
            "`--size small` is the paper's regime (a target beyond the cache)"
            if size == "mini"
            else "the small pair (bfloat16 target, float32 draft) measured 2.1-2.5x at batch 1 on a 2-core AMD EPYC "
            "(Zen 4, AVX512_BF16; benchmarks/results/small_pair/)"
        )
        print(
            "note: on a CPU the target's (gamma+1)-token verification window costs 1.3-2x a one-token step "
            "(about 1x on the paper's accelerators) and another job on the machine slows both sides unevenly; "
            f"{hint}. See docs/benchmarks.md."
        )
    return 0

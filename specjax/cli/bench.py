"""``specjax bench``: the paper's Table 2 layout, theory against measurement, and transformers side by side.

Rows come from an experiment file (``--config configs/paper_table2.json``; layout in ``configs/README.md``)
or from the command line (``--target/--draft/--tokenizer/--input``; with neither, the shipped default pair
on Multi30k test 2016). Every row is measured at each γ and batch size: speculative_sample and
temperature_sample on the same inputs, alternating, after compilation (compile time reported apart).
Drafting variants are sweep axes too: ``--verification token block``, ``--draft-confidence-threshold 0.3
0.5`` (``none`` = off), and ``--draft prompt-lookup`` (n-gram proposals, no draft model; ``--max-ngram``); the
tables then say each row's verification, confidence threshold and draft.
Writes ``table.md``, ``table.csv``, ``results.json``, ``alpha_vs_gamma.png`` and ``speedup_vs_gamma.png``
to ``--out``. ``--profile`` traces the real compiled decode (``jax.profiler``) and writes ``profile.md/json``:
per loop iteration the time in each named scope, thunks per iteration, the fixed per-call cost, beside this
machine's memory bandwidth and matmul throughput (``--profile-only`` skips the table). ``--against
ctranslate2`` writes ``ctranslate2.md/json``: each engine in its own process (``specjax.bench.processes``: the
target converted by CTranslate2's converter, float32, 1 and 2 threads, against specjax's target alone, gamma
auto and each --gammas, greedy), alternating, best of --rounds x --passes, the CPU named. ``--hf`` adds
``hf_compare.md/json`` and ``scaling.md/json`` (transformers).
"""

from __future__ import annotations

import argparse
import sys

from specjax.cli import add_size_arg

_LOOKUP = "prompt-lookup"  # specjax.bench.PROMPT_LOOKUP, spelled here so --help imports nothing heavy


def _threshold(text: str) -> float | None:
    """A ``--draft-confidence-threshold`` value: a number, or ``none`` / ``off`` (no threshold: fixed γ)."""
    if text.lower() in ("none", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1] or 'none', got {text!r}") from None


def add_parser(sub) -> None:
    """Registers ``specjax bench``."""
    p = sub.add_parser(
        "bench",
        help="Table-2 style benchmark: alpha, speedup, theory vs measured, plots; --hf: vs transformers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_argument_group("what to run")
    src.add_argument("--config", help="experiment file (e.g. configs/paper_table2.json, configs/mini_pair_cpu.json)")
    src.add_argument("--task", action="append", help="only rows of this task (repeatable)")
    src.add_argument("--draft-name", action="append", help="only rows with this draft name (repeatable)")
    src.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="replace a model of the experiment file, e.g. T5-XXL=gs://my-bucket/xxl_ende/checkpoint_N",
    )
    src.add_argument("--target", help="target checkpoint (overrides every row's target)")
    src.add_argument(
        "--draft",
        help="draft checkpoint, or 'prompt-lookup' (n-gram proposals from the input and the "
        "output so far, no draft model); overrides every row's draft",
    )
    src.add_argument("--tokenizer", help="SentencePiece model (local or gs://); 'default' = the shipped pair's")
    src.add_argument("--input", help="input text file, one input per line (without --config)")
    src.add_argument("--references", help="line-aligned references for BLEU/ROUGE (without --config)")
    src.add_argument("--metric", choices=["bleu", "rouge", "none"], help="quality metric (without --config: bleu)")
    src.add_argument("--task-name", default=None, help="task name printed in the table (without --config)")
    src.add_argument(
        "--prefix",
        default=None,
        help='task prefix, e.g. "translate English to German: " or "summarize: " (overrides the file)',
    )
    sweep = p.add_argument_group("sweep (override the experiment file)")
    sweep.add_argument(
        "--gammas", type=int, nargs="+", help="γ values (default: each row's; without --config 1 2 3 4 5)"
    )
    sweep.add_argument("--temperatures", type=float, nargs="+", help="temperatures (default: each row's; else 0 1)")
    sweep.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        default=[1],
        help="batch sizes (default 1: one call per input, the paper's setting); above 1, bulk decoding through that "
        "many slots refilled as lines finish, against the target alone through the same slots (as specjax generate)",
    )
    sweep.add_argument(
        "--verification",
        nargs="+",
        choices=["token", "block"],
        help="verifiers: token = Leviathan et al. 2023, Algorithm 1; block = Sun et al. 2025 "
        "(default: each row's; else token)",
    )
    sweep.add_argument(
        "--draft-confidence-threshold",
        type=_threshold,
        nargs="+",
        metavar="P",
        help="draft confidence thresholds in [0, 1], 'none' = off: a row stops drafting after a "
        "draft token whose probability is below P, γ at most (default: each row's; else off)",
    )
    sweep.add_argument(
        "--max-ngram",
        type=int,
        help="with --draft prompt-lookup: the longest n-gram matched (default: each row's; else 3)",
    )
    sweep.add_argument("--num-inputs", type=int, help="first N input lines (default: the file's; without --config 32)")
    sweep.add_argument("--max-decode-length", type=int, help="most output tokens (default: the file's; else 64)")
    sweep.add_argument("--max-input-length", type=int, help="inputs truncated to this many tokens (default 512)")
    sweep.add_argument("--repeats", type=int, default=1, help="passes over the inputs per measurement (default 1)")
    sweep.add_argument("--seed", type=int, default=0)
    add_size_arg(sweep)
    sweep.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "int8"],
        help="compute dtype of the target, and of the draft unless --draft-dtype (default auto: the shipped "
        "pair in bfloat16 only on a CPU with native bfloat16 dots, avx512_bf16 / amx_bf16, or on TPU/GPU, "
        "else float32; checkpoints in float32; int8: weight-only int8 with Qwix, computed in auto's dtype)",
    )
    sweep.add_argument(
        "--draft-dtype",
        default=None,
        choices=["auto", "float32", "bfloat16", "int8"],
        help="compute dtype of the draft (default: --dtype; int8: Qwix weight-only); float32 beside a bfloat16 target "
        "was the fastest pairing on CPU",
    )
    sweep.add_argument("--cost-steps", type=int, default=32, help="decode calls per timing loop for c")
    sweep.add_argument(
        "--auto",
        action="store_true",
        help="also a gamma auto row per batch size and temperature (specjax.Decoder: gamma chosen per call "
        "from measured costs and the running alpha, 0 = the target alone)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--out", default="bench_out", help="output directory (default bench_out)")
    out.add_argument("--no-quality", action="store_true", help="skip BLEU/ROUGE")
    out.add_argument("--no-plots", action="store_true")
    out.add_argument(
        "--profile",
        action="store_true",
        help="trace the compiled decode with jax.profiler: ms per iteration per named scope, thunks per "
        "iteration, fixed per-call cost, beside measured memory bandwidth and matmul throughput",
    )
    out.add_argument("--profile-only", action="store_true", help="only the profile (no table)")
    out.add_argument("--no-table", action="store_true", help="skip the table (e.g. with --against or --profile)")
    out.add_argument(
        "--profile-calls", type=int, default=4, help="decode calls (batches) traced per profile (default 4)"
    )
    peers = p.add_argument_group("peers side by side")
    peers.add_argument(
        "--against",
        choices=["ctranslate2"],
        action="append",
        default=[],
        help="ctranslate2: the target converted by CTranslate2 (float32; 1 and 2 threads) against specjax's "
        "target alone, gamma auto and each --gammas, greedy, at each --batch-sizes, on the first row's inputs, "
        "each engine in its own process (pip install 'specjax[bench]')",
    )
    peers.add_argument("--rounds", type=int, default=2, help="with --against: runs of every engine (default 2)")
    peers.add_argument("--passes", type=int, default=2, help="with --against: timed passes per run (default 2)")
    hf = peers
    hf.add_argument(
        "--hf",
        action="store_true",
        help="also run transformers assisted/plain generate on the first row's pair and inputs "
        "(CPU, float32, batch 1), check greedy tokens, and measure batch scaling",
    )
    hf.add_argument("--hf-only", action="store_true", help="only the transformers comparison and batch scaling")
    hf.add_argument("--hf-inputs", type=int, default=16, help="inputs for the comparison (default 16)")
    hf.add_argument("--hf-gamma", type=int, help="γ for the comparison (default: the first row's first γ)")
    hf.add_argument("--scaling-batch-sizes", type=int, nargs="+", default=[1, 4, 16, 32])
    p.set_defaults(func=run)


def _rows(args):
    import dataclasses
    import os

    from specjax import bench
    from specjax.defaults import demo_sentences

    if args.config:
        meta, rows = bench.load_experiment(args.config)
        overrides = {}
        for item in args.model:
            if "=" not in item:
                raise ValueError(f"--model takes NAME=PATH, got {item!r}.")
            name, path = item.split("=", 1)
            known = meta.get("models", {})
            if name not in known:
                raise ValueError(f"--model {name!r}: the experiment's models are {sorted(known)}.")
            overrides[name] = path
        rows = [
            dataclasses.replace(
                r, target_path=overrides.get(r.target, r.target_path), draft_path=overrides.get(r.draft, r.draft_path)
            )
            for r in rows
        ]
        if args.task:
            rows = [r for r in rows if r.task in args.task]
        if args.draft_name:
            rows = [r for r in rows if r.draft in args.draft_name]
        if not rows:
            raise ValueError(f"No rows of {args.config} match --task {args.task} --draft-name {args.draft_name}.")
    else:
        lookup = args.draft == _LOOKUP
        if bool(args.target) != bool(args.draft) and not lookup:
            raise ValueError(
                "Give both --target and --draft, or neither (the shipped default pair); --draft "
                "prompt-lookup needs no draft model."
            )
        if args.input:
            inp, refs = args.input, args.references
        else:
            _, inp = demo_sentences()
            ref = inp[:-3] + ".de" if inp.endswith(".en") else None
            refs = args.references or (ref if ref and os.path.exists(ref) else None)
        metric = None if args.metric == "none" else (args.metric or "bleu")
        temps = args.temperatures or [0.0, 1.0]
        rows = [
            bench.BenchRow(
                task=args.task_name or ("multi30k" if not args.input else os.path.splitext(os.path.basename(inp))[0]),
                target="target" if args.target else "default target",
                draft=_LOOKUP if lookup else ("draft" if args.draft else "distilled"),
                target_path=args.target or _default(args, "target"),
                draft_path=args.draft or _default(args, "distilled"),
                temperature=float(t),
                gammas=tuple(args.gammas or (1, 2, 3, 4, 5)),
                input=inp,
                references=refs,
                metric=metric,
                tokenizer=args.tokenizer or ("default" if not args.target else ""),
                num_inputs=args.num_inputs or 32,
                max_decode_length=args.max_decode_length or 64,
                max_input_length=args.max_input_length or 512,
                prefix=args.prefix or "",
                verifications=tuple(args.verification or ("token",)),
                confidence_thresholds=tuple(args.draft_confidence_threshold or (None,)),
                max_ngram=3 if args.max_ngram is None else args.max_ngram,
            )
            for t in temps
        ]
        if args.target and not args.tokenizer:
            raise ValueError("--tokenizer SPIECE_MODEL is needed with --target/--draft checkpoints.")
        return rows
    # Overrides on experiment-file rows.
    new = []
    for r in rows:
        changes = {}
        if args.target:
            changes.update(target_path=args.target, target="target")
        if args.draft:
            changes.update(draft_path=args.draft, draft=_LOOKUP if args.draft == _LOOKUP else "draft")
        if args.tokenizer:
            changes["tokenizer"] = args.tokenizer
        if args.gammas:
            changes["gammas"] = tuple(args.gammas)
        if args.verification:
            changes["verifications"] = tuple(args.verification)
        if args.draft_confidence_threshold:
            changes["confidence_thresholds"] = tuple(args.draft_confidence_threshold)
        if args.max_ngram is not None:
            changes["max_ngram"] = args.max_ngram
        for key in ("num_inputs", "max_decode_length", "max_input_length", "prefix"):
            if getattr(args, key) is not None:
                changes[key] = getattr(args, key)
        if args.metric:
            changes["metric"] = None if args.metric == "none" else args.metric
        new.append(dataclasses.replace(r, **changes))
    if args.temperatures:
        seen, expanded = set(), []
        for r in new:
            for t in args.temperatures:
                key = (r.task, r.target_path, r.draft_path, float(t))
                if key not in seen:
                    seen.add(key)
                    expanded.append(dataclasses.replace(r, temperature=float(t)))
        new = expanded
    return new


def _check_variants(rows) -> None:
    """Refuses, before anything loads, a row whose drafting variants ``speculative_sample`` would not take:
    each (verification, threshold) pair goes through the CLI's own ``speculative_kwargs`` (so the messages
    are ``specjax generate``'s), and a prompt-lookup row builds its ``PromptLookupDraft`` (``draft_source``).

    Raises:
      ValueError: a threshold outside [0, 1] or with ``--draft prompt-lookup``; ``--max-ngram`` < 1.
    """
    from specjax.cli import draft_source, speculative_kwargs

    for r in rows:
        lookup = r.draft_path == _LOOKUP
        for v in r.verifications:
            for c in r.confidence_thresholds:
                speculative_kwargs(
                    argparse.Namespace(verification=v, draft_confidence_threshold=c, draft=_LOOKUP if lookup else None)
                )
        if lookup:
            if r.max_ngram < 1:
                raise ValueError(f"--max-ngram must be >= 1, got {r.max_ngram}; 3 is the usual choice.")
            draft_source(argparse.Namespace(draft=_LOOKUP, max_ngram=r.max_ngram), None)


def _draft(loader, row):
    """The row's draft: its loaded model, or ``specjax.PromptLookupDraft(max_ngram=row.max_ngram)`` for a
    prompt-lookup row (the CLI's ``draft_source``)."""
    from specjax.cli import draft_source

    lookup = row.draft_path == _LOOKUP
    return draft_source(
        argparse.Namespace(draft=_LOOKUP if lookup else None, max_ngram=row.max_ngram),
        None if lookup else loader.model(row.draft_path, draft=True),
    )


def _default(args, kind: str) -> str:
    """The bench path of a shipped model: ``default:KIND``, or ``default:SIZE:KIND`` with --size."""
    return f"default:{args.size}:{kind}" if args.size else f"default:{kind}"


class _Loader:
    """Loads each checkpoint (in the target's or the draft's dtype) and tokenizer once per run."""

    def __init__(self, dtype: str, draft_dtype: str | None = None):
        self.dtype, self.draft_dtype = dtype, draft_dtype or dtype
        self.models, self.tokenizers = {}, {}

    def model(self, path: str, draft: bool = False):
        dtype = self.draft_dtype if draft else self.dtype
        if (path, dtype) not in self.models:
            if path.startswith("default:"):
                from specjax.defaults import load_default_pair

                *size, kind = path.split(":")[1:]  # default:KIND (the default size) or default:SIZE:KIND
                target, draft_model, _ = load_default_pair(
                    "distilled" if kind == "target" else kind, dtype=dtype, size=size[0] if size else None
                )
                self.models[path, dtype] = target if kind == "target" else draft_model
            else:
                from specjax.checkpoints import load_checkpoint

                self.models[path, dtype] = load_checkpoint(path, dtype="float32" if dtype == "auto" else dtype)
        return self.models[path, dtype]

    def tokenizer(self, path: str):
        if path not in self.tokenizers:
            from specjax.tokenizer import Tokenizer

            if path in ("default", ""):
                if path == "":
                    raise ValueError("A tokenizer is needed: pass --tokenizer SPIECE_MODEL.")
                from specjax.defaults import PAIRS

                self.tokenizers[path] = Tokenizer(str(PAIRS["mini"] / "spiece.model"), extra_ids=0)
            elif path.startswith("gs://"):
                self.tokenizers[path] = Tokenizer(_fetch_gcs(path))
            else:
                self.tokenizers[path] = Tokenizer(path)
        return self.tokenizers[path]


def _fetch_gcs(url: str) -> str:
    """Copies a gs:// file to a local temporary file (TensorStore's gcs key-value store); returns its path."""
    import os
    import tempfile

    import tensorstore as ts

    bucket, _, key = url[len("gs://") :].partition("/")
    from specjax.checkpoints.t5x import gcs_spec

    value = ts.KvStore.open(gcs_spec(bucket)).result().read(key).result().value
    if not value:
        raise FileNotFoundError(f"Could not read {url} (empty or missing; check access with gsutil ls).")
    path = os.path.join(tempfile.mkdtemp(prefix="specjax_"), os.path.basename(key))
    with open(path, "wb") as f:
        f.write(value)
    return path


def run(args: argparse.Namespace) -> int:
    """Runs the benchmark; returns 0. Raises ValueError / FileNotFoundError with a message on bad input."""
    import json
    import os

    import numpy as np
    from tqdm.auto import tqdm

    from specjax import bench

    for name in ("num_inputs", "max_decode_length", "max_input_length", "hf_inputs", "profile_calls", "max_ngram"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {v}.")
    if args.repeats < 1 or any(b < 1 for b in args.batch_sizes) or any(g < 1 for g in (args.gammas or [1])):
        raise ValueError("--repeats, --batch-sizes and --gammas must be >= 1.")
    rows = _rows(args)
    _check_variants(rows)
    first_lookup, any_lookup = rows[0].draft_path == _LOOKUP, any(r.draft_path == _LOOKUP for r in rows)
    for flag, refused in (
        ("--profile", (args.profile or args.profile_only) and any_lookup),  # every row
        ("--against", args.against and first_lookup),  # the first row
        ("--hf", (args.hf or args.hf_only) and first_lookup),
    ):
        if refused:
            raise ValueError(
                f"{flag} needs a draft model; --draft prompt-lookup has none (drop one of the two, "
                "or run them separately)."
            )
    os.makedirs(args.out, exist_ok=True)
    loader = _Loader(args.dtype, args.draft_dtype)
    env = bench.environment()
    print(
        f"jax {env['jax']}, backend {env['backend']}, {env['device_count']} x {env['device_kind']}; "
        f"{len(rows)} rows -> {args.out}",
        file=sys.stderr,
    )
    records, hf_result, scaling = [], None, None

    if not (args.hf_only or args.profile_only or args.no_table):

        def count(r):
            n = min(r.num_inputs, len(bench.read_lines(r.input, r.num_inputs)))
            return (
                sum(-(-n // b) for b in args.batch_sizes)
                * len(r.gammas)
                * len(r.verifications)
                * len(r.confidence_thresholds)
                * args.repeats
            ) + (sum(-(-n // b) for b in args.batch_sizes) * args.repeats if args.auto else 0)

        total = sum(count(r) for r in rows)
        with tqdm(total=total, desc="bench", unit="batch", file=sys.stderr) as bar:
            for r in rows:
                bar.set_postfix_str(f"{r.task} {r.draft} T={r.temperature:g} loading")
                target, draft = loader.model(r.target_path), _draft(loader, r)
                tok = loader.tokenizer(r.tokenizer)
                bar.set_postfix_str(f"{r.task} {r.draft} T={r.temperature:g}")
                recs = bench.run_row(
                    target,
                    draft,
                    tok,
                    r,
                    batch_sizes=args.batch_sizes,
                    repeats=args.repeats,
                    seed=args.seed,
                    cost_steps=args.cost_steps,
                    with_quality=not args.no_quality,
                    on_batch=lambda: bar.update(1),
                    auto=args.auto and r.draft_path != _LOOKUP,
                )
                for x in recs:
                    if x["gamma"] == "auto":
                        ran = ", ".join(f"{g}x{x['gammas_run'].count(g)}" for g in sorted(set(x["gammas_run"])))
                        tqdm.write(
                            f"{x['task']:>10} {x['draft']:>12} T={x['temperature']:g} γ=auto (ran {ran}) "
                            f"b={x['batch_size']}: speedup {x['speedup']:.2f}x",
                            file=sys.stderr,
                        )
                        continue
                    variant = (f" {x['verification']}" if x["verification"] != "token" else "") + (
                        f" conf {x['confidence_threshold']:g}" if x["confidence_threshold"] is not None else ""
                    )
                    tqdm.write(
                        f"{x['task']:>10} {x['draft']:>12}{variant} T={x['temperature']:g} γ={x['gamma']} "
                        f"b={x['batch_size']}: α={x['alpha']:.3f} ({x['alpha_source']}), accepted fraction "
                        f"{x['accepted_fraction']:.3f}, mean accepted length {x['mean_accepted_length']:.2f}, "
                        f"speedup {x['speedup']:.2f}x "
                        f"(theory {x['expected_improvement']:.2f}x, c={x['c']:.3f})",
                        file=sys.stderr,
                    )
                records += recs
        md = bench.format_markdown(records)
        with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
            f.write(md)
        bench.write_csv(records, os.path.join(args.out, "table.csv"))
        if not args.no_plots:
            bench.plot_records(records, args.out)
        print(md)

    profiles = ct2 = None
    if args.profile or args.profile_only:
        from specjax.bench import profile

        limits = profile.machine_limits()
        print(
            f"machine: memory {limits['memory_gb_s']:.1f} GB/s, cache-sized copy {limits['cache_gb_s']:.1f} GB/s, "
            f"matmul {limits['matmul_gflop_s']:.1f} GFLOP/s",
            file=sys.stderr,
        )
        profiles, texts = [], []
        for r in rows:
            target, draft = loader.model(r.target_path), loader.model(r.draft_path, draft=True)
            ids = bench.encode_inputs(
                loader.tokenizer(r.tokenizer), bench.read_lines(r.input, r.num_inputs), r.prefix, r.max_input_length
            )
            for bs in args.batch_sizes:
                batches = bench.pad_batches(ids, batch_size=bs, pad_id=target.config.pad_id)[: args.profile_calls]
                for g in r.gammas:
                    rep = profile.profile_decode(
                        target,
                        draft,
                        batches,
                        gamma=g,
                        temperature=r.temperature,
                        max_decode_length=r.max_decode_length,
                        seed=args.seed,
                        limits=limits,
                    )
                    rep.update(task=r.task, target=r.target, draft=r.draft)
                    profiles.append(rep)
                    texts.append(
                        f"{r.task}, target {r.target}, draft {r.draft}: "
                        + profile.format_profile(rep).replace("### ", "", 1)
                    )
                    print(texts[-1], file=sys.stderr)
        env_line = (
            f"jax {env['jax']}, backend {env['backend']}, {env['device_count']} x {env['device_kind']}; "
            f"machine: memory {limits['memory_gb_s']:.1f} GB/s (NumPy copy of "
            f"{limits['copy_bytes'] >> 20} MiB, read + write), {limits['cache_gb_s']:.1f} GB/s "
            f"({limits['cache_bytes'] >> 20} MiB), matmul {limits['matmul_gflop_s']:.1f} GFLOP/s "
            f"(jitted float32 {limits['matmul_n']}²)"
        )
        with open(os.path.join(args.out, "profile.md"), "w", encoding="utf-8") as f:
            f.write(
                "# Profile of the compiled decode (`specjax bench --profile`)\n\n"
                + env_line
                + "\n\ncommand: `"
                + " ".join(["specjax"] + sys.argv[1:])
                + "`\n\n"
                + "\n\n".join("### " + t for t in texts)
                + "\n"
            )
        with open(os.path.join(args.out, "profile.json"), "w", encoding="utf-8") as f:
            json.dump({"environment": env, "limits": limits, "profiles": profiles}, f, indent=1, default=float)

    if args.against:
        from specjax.bench import processes

        r = rows[0]
        if r.target_path.startswith("gs://") or r.draft_path.startswith("gs://"):
            raise ValueError(
                "--against runs each engine in its own process from local paths; copy the gs:// "
                "checkpoints to a local directory first."
            )
        ids = bench.encode_inputs(
            loader.tokenizer(r.tokenizer), bench.read_lines(r.input, r.num_inputs), r.prefix, r.max_input_length
        )
        engines = 4 + len(r.gammas)  # target alone, auto, each γ, CTranslate2 at 1 and 2 threads
        with tqdm(total=engines * args.rounds * len(args.batch_sizes), desc="engines", file=sys.stderr) as bar:
            ct2 = processes.compare_in_processes(
                r.target_path,
                r.draft_path,
                ids,
                dtype=args.dtype,
                draft_dtype=args.draft_dtype,
                gammas=("auto", *r.gammas),
                max_decode_length=r.max_decode_length,
                batch_sizes=args.batch_sizes,
                rounds=args.rounds,
                passes=args.passes,
                seed=args.seed,
                workdir=os.path.join(args.out, "ct2_export"),
                on_step=lambda name: bar.update(1),
            )
        text = processes.format_processes(ct2)
        print(text)
        with open(os.path.join(args.out, "ctranslate2.md"), "w", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(args.out, "ctranslate2.json"), "w", encoding="utf-8") as f:
            json.dump(ct2, f, indent=1, default=float)

    if args.hf or args.hf_only:
        from specjax.bench import peers as hf_compare

        r = rows[0]
        target, draft = loader.model(r.target_path), loader.model(r.draft_path, draft=True)
        tok = loader.tokenizer(r.tokenizer)
        ids = bench.encode_inputs(tok, bench.read_lines(r.input, args.hf_inputs), r.prefix, r.max_input_length)
        gamma = args.hf_gamma or r.gammas[0]
        hf_dir = os.path.join(args.out, "hf_export")
        with tqdm(total=2 * len(ids), desc="transformers side by side", unit="input", file=sys.stderr) as bar:
            hf_models = (
                hf_compare.to_transformers(target, os.path.join(hf_dir, "target")),
                hf_compare.to_transformers(draft, os.path.join(hf_dir, "draft")),
            )
            hf_result = hf_compare.compare_with_transformers(
                target,
                draft,
                ids,
                gamma=gamma,
                max_decode_length=r.max_decode_length,
                seed=args.seed,
                hf_models=hf_models,
                on_item=lambda: bar.update(1),
            )
        with tqdm(total=len(args.scaling_batch_sizes), desc="batch scaling", unit="batch size", file=sys.stderr) as bar:
            scaling = hf_compare.batch_scaling(
                target,
                draft,
                ids,
                gamma=gamma,
                max_decode_length=r.max_decode_length,
                batch_sizes=args.scaling_batch_sizes,
                seed=args.seed,
                hf_target=hf_models[0],
                on_step=lambda: bar.update(1),
            )
        text = hf_compare.format_comparison(hf_result)
        stext = hf_compare.format_scaling(scaling)
        print(text + "\n" + stext)
        for name, obj, txt in (("hf_compare", hf_result, text), ("scaling", scaling, stext)):
            with open(os.path.join(args.out, f"{name}.json"), "w", encoding="utf-8") as f:
                json.dump(obj, f, indent=1, default=float)
            with open(os.path.join(args.out, f"{name}.md"), "w", encoding="utf-8") as f:
                f.write(txt)

    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "command": sys.argv,
                "environment": env,
                "records": records,
                "hf_compare": hf_result,
                "scaling": scaling,
                "ctranslate2": ct2,
                "profiles": profiles,
            },
            f,
            indent=1,
            default=lambda o: float(o) if isinstance(o, (np.floating, np.integer)) else str(o),
        )
    return 0

"""``specjax aot``: compile the decode programs for a TPU slice on this host (no TPU, no weights) and report
their memory per device, each loop piece's HBM traffic read from the compiled HLO beside XLA's cost model, c,
and the paper's Table 2 projected with them (estimates, not a run).

Needs libtpu (``pip install 'specjax[tpu-aot]'``); without it the command says so and exits with status 2.
"""

from __future__ import annotations

import sys


def add_parser(subparsers) -> None:
    """Registers ``aot`` and its arguments."""
    from specjax.defaults import DECODE_DEFAULTS as D

    p = subparsers.add_parser(
        "aot",
        help="compile for a TPU topology ahead of time (no TPU needed) and report memory and costs",
        description="Compile speculative_sample and temperature_sample exactly as model_parallel_sample / "
        "data_parallel_sample run them, and the loop's pieces (target step, verification window, draft step), "
        "for a named TPU slice, with abstract weights, on this host. Reports memory per device against the "
        "chip's HBM, each piece's HBM traffic read from the compiled HLO beside XLA's cost model (bytes over the "
        "chip's bandwidth, flops over its peak: estimates, not a measurement), c = draft step / target step, "
        "window / step, the paper's Table 2 projected, and "
        "the collectives per loop iteration. Needs libtpu: pip install 'specjax[tpu-aot]'.",
    )
    p.add_argument("--topology", required=True, help="TPU slice: v4-1 (one v4 chip), v4-8, v4-32, v5e-8, v5p-8 …")
    p.add_argument("--target", default="t5_1_1_xxl", help="T5 preset or checkpoint dir / config.json (no weights)")
    p.add_argument("--draft", default="t5_1_1_small", help="draft preset or config; 'none': the target alone")
    p.add_argument(
        "--gamma",
        type=int,
        default=D.aot_gamma,
        help=f"draft tokens per iteration (default {D.aot_gamma}, the paper's T5-XXL row; one program per gamma)",
    )
    p.add_argument("--batch", type=int, default=1, help="rows per call (default 1)")
    p.add_argument("--input-length", type=int, default=512, help="encoder tokens, padded width (default 512)")
    length = D.max_decode_length["text"]
    p.add_argument("--output-length", type=int, default=length, help=f"max_decode_length in tokens (default {length})")
    p.add_argument("--temperature", type=float, default=0.0, choices=(0.0, 1.0), help="0 greedy (default) or 1")
    p.add_argument("--verifier", choices=("token", "block"), default="token", help="verification (default token)")
    p.add_argument(
        "--mesh",
        default=None,
        help="data:N,model:M (default: a data axis no larger than --batch, then the smallest model split that "
        "fits; at batch 1 every chip splits the model: data:1,model:4 on a v4-8)",
    )
    p.add_argument("--data-parallel", action="store_true", help="data_parallel_sample's program (weights replicated)")
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float32", "int8"),
        default="bfloat16",
        help="weights and compute; int8: weight-only int8 target and draft (Qwix), bfloat16 compute, whole "
        "programs only (with --no-pieces)",
    )
    p.add_argument(
        "--programs",
        default="speculative_sample,temperature_sample",
        help="whole programs to compile, comma-separated, or 'none' (default: both)",
    )
    p.add_argument("--no-pieces", action="store_true", help="skip the per-piece programs and the projections")
    p.add_argument(
        "--num-drafts",
        type=int,
        nargs="+",
        default=[1],
        metavar="K",
        help="multi-draft: also compile the K-branch verification window and project the paper's rows with K "
        "drafts (K in 1 2 4; default 1)",
    )
    p.add_argument(
        "--branch-gammas",
        type=int,
        nargs="+",
        default=None,
        metavar="G",
        help="γ values of the K-branch windows (default: every window's γ: --gamma and the paper rows' γ)",
    )
    p.add_argument(
        "--bulk-slots",
        type=int,
        default=None,
        metavar="N",
        help="compile bulk decoding's programs instead (slot insert, the run loop at --gamma and the target alone) "
        "for N slots: memory per chip, host transfers in the loop, tokens/s per chip from one iteration's HBM traffic",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="α for --bulk-slots' tokens per iteration (default: the paper's EnDe row for the draft and temperature)",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    """Compiles and prints the report; 2 when libtpu is missing or the configuration does not fit."""
    from specjax import aot

    aot._topology(args.topology)  # an unknown topology is named before the libtpu check (no 680 MB install first)
    if args.json:
        from specjax.cli._common import check_output_path

        check_output_path(args.json, "--json")  # before minutes of compiling
    if args.bulk_slots is not None and args.bulk_slots < 1:
        print(f"specjax aot: --bulk-slots must be at least 1, got {args.bulk_slots}.", file=sys.stderr)
        return 2
    if args.alpha is not None and not 0.0 <= args.alpha <= 1.0:
        print(f"specjax aot: --alpha must be in [0, 1], got {args.alpha}.", file=sys.stderr)
        return 2
    if args.bulk_slots is not None:
        return _run_bulk(args, aot)
    try:
        aot.require_libtpu()
        report = aot.compile_report(
            args.topology,
            args.target,
            None if args.draft.lower() == "none" else args.draft,
            gamma=args.gamma,
            batch=args.batch,
            input_length=args.input_length,
            output_length=args.output_length,
            temperature=args.temperature,
            verification=args.verifier,
            mesh=args.mesh,
            dtype=args.dtype,
            data_parallel=args.data_parallel,
            programs=() if args.programs == "none" else tuple(x.strip() for x in args.programs.split(",")),
            pieces=not args.no_pieces,
            num_drafts=tuple(args.num_drafts),
            branch_gammas=args.branch_gammas,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except aot.LibtpuMissing as e:
        print(f"specjax aot: {e}", file=sys.stderr)
        return 2
    print(aot.format_report(report))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
    failed = [p["name"] for p in report["programs"] + list(report.get("pieces", {}).values()) if not p["compiled"]]
    return 1 if failed else 0


def _run_bulk(args, aot) -> int:
    """``--bulk-slots``: compiles and prints ``aot.bulk_report``; 2 when libtpu is missing."""
    try:
        aot.require_libtpu()
        report = aot.bulk_report(
            args.topology,
            args.target,
            None if args.draft.lower() == "none" else args.draft,
            slots=args.bulk_slots,
            gamma=args.gamma,
            input_length=args.input_length,
            output_length=args.output_length,
            temperature=args.temperature,
            verification=args.verifier,
            mesh=args.mesh,
            dtype=args.dtype,
            alpha=args.alpha,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except aot.LibtpuMissing as e:
        print(f"specjax aot: {e}", file=sys.stderr)
        return 2
    print(aot.format_bulk_report(report))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0 if all(p["compiled"] for p in report["programs"]) else 1

"""``specjax generate``: decode a file of input lines with speculative sampling, in batches, resumably.

Example::

    specjax generate --target t5_xxl/checkpoint_1000000 --draft t5_small/checkpoint_1000000 \\
        --input inputs.en --output outputs.de --gamma 5 --temperature 0 \\
        --prefix "translate English to German: " --compare-baseline

Each output line is the decode of the input line with the same number (after ``--prefix``). The lines go through
the bulk decoder (``specjax.bulk``: ``--batch-size`` decode slots, refilled as rows end, inputs sorted by length
in a read-ahead window); each output line is flushed as soon as it and every earlier line are done, so running the
same command again resumes after the lines already in ``--output``. Line ``i`` of the file samples with
``fold_in(PRNGKey(seed), i)``, so outputs do not depend on ``--batch-size``, the devices or on resuming.
``--data-parallel`` / ``--mesh data:N,model:M`` split the slots over "data" and the target's weights over "model"
(``specjax.parallel``); on several processes each decodes its share of the lines and process 0 writes them all.
"""

from __future__ import annotations

import argparse
import os
import sys

from specjax.cli import SHIPPED_PAIR_DOMAIN, add_decoding_args, add_size_arg, resolve_decoding_defaults
from specjax.cli._common import OutputLines, check_output_path, lines_done
from specjax.cli._lines import encode_lines, output_text

DEFAULT_TOKENIZER = os.path.join("..", "shared", "data", "tokenizer", "t5", "spiece.model")


def add_parser(sub) -> None:
    """Registers ``specjax generate``."""
    p = sub.add_parser(
        "generate",
        help="decode a file of input lines with speculative sampling",
        description="Reads input lines, decodes them in batches with speculative sampling (Leviathan et al. "
        "2023) and writes one output line per input line, in input order. Resumes after the lines "
        "already in --output. Prints acceptance rate, tokens per target call and tokens/second. " + SHIPPED_PAIR_DOMAIN,
    )
    p.add_argument("--target", help="target checkpoint (T5X or Hugging Face); default: the embedded pair")
    p.add_argument(
        "--draft",
        help="draft checkpoint, or 'prompt-lookup' (no draft model: n-gram proposals from the "
        "input and the output so far); default: the embedded pair's draft",
    )
    p.add_argument("--input", help="input text file, one input per line, or - for stdin (required unless --seqio-task)")
    p.add_argument(
        "--output", required=True, help="output text file (appended to: an existing file is resumed), or - for stdout"
    )
    p.add_argument(
        "--tokenizer",
        help=f"SentencePiece model, or 'byt5' for ByT5's byte vocabulary (default: the target checkpoint's own "
        f"spiece.model or ByT5 bytes, else {DEFAULT_TOKENIZER} if it exists; the embedded pair's own vocabulary "
        "without --target/--draft)",
    )
    p.add_argument("--prefix", default="", help='task prefix, e.g. "translate English to German: "')
    add_decoding_args(
        p,
        task="text",
        seed_help="PRNG seed (line i uses fold_in(seed key, i))",
        fixed_gamma_flags="--mesh / --data-parallel",
    )
    add_size_arg(p)
    p.add_argument("--batch-size", type=int, default=32, help="rows per decode call (default 32)")
    p.add_argument(
        "--max-input-length", type=int, default=512, help="most input tokens per line, EOS included (default 512)"
    )
    p.add_argument("--truncate", action="store_true", help="cut longer inputs instead of failing")
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "int8"),
        default="auto",
        help="parameters and compute of the target, and of the draft unless --draft-dtype (default auto, as "
        "load_default_pair: the shipped pair in bfloat16 only on a CPU with native bfloat16 dots or an "
        "accelerator, else float32; --target/--draft checkpoints in float32, as load_checkpoint; bfloat16 halves "
        "memory, e.g. for T5-XXL on TPU; int8: weight-only int8 (Qwix), computed in auto's dtype; an int8 target's "
        "output is the int8 target's own)",
    )
    p.add_argument(
        "--draft-dtype",
        choices=("auto", "float32", "bfloat16", "int8"),
        default=None,
        help="the draft's dtype (default: with --dtype auto and the shipped pair, the draft's path for this CPU; "
        "else --dtype); int8 changes only alpha, never the output",
    )
    p.add_argument(
        "--compare-baseline",
        action="store_true",
        help="also run temperature_sample (target alone) on the same batches and print the speedup",
    )
    p.add_argument(
        "--data-parallel",
        action="store_true",
        help="split the decode slots over all devices (weights replicated): --mesh data:<devices>,model:1",
    )
    p.add_argument(
        "--mesh",
        metavar="data:N,model:M",
        help="decode slots split over 'data' (--batch-size rounded up to a multiple of N), the target's weights "
        "over 'model' (for targets larger than one device, e.g. T5-XXL); N*M = the device count of all processes "
        "(on several, 'data' is split over the processes and 'model' lies within each)",
    )
    p.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="run as N local JAX processes on this machine, joined by JAX's coordination service as the hosts of "
        "a TPU slice are (CPU host devices; process 0 writes --output); on a slice run the command on every host "
        "instead (docs/tpu.md)",
    )
    p.add_argument(
        "--devices-per-process",
        type=int,
        metavar="D",
        help="host devices of each --processes process (default: the --mesh size / N, else 1)",
    )
    seqio = p.add_argument_group("seqio (pip install 'specjax[seqio]')")
    seqio.add_argument(
        "--seqio-task",
        metavar="NAME",
        help="decode this registered seqio Task's --split instead of --input, and print its metrics",
    )
    seqio.add_argument(
        "--seqio-module",
        metavar="MODULE",
        action="append",
        default=[],
        help="module (or .py file) to import first, which registers the Task (as t5x's "
        "MIXTURE_OR_TASK_MODULE); repeatable",
    )
    seqio.add_argument("--split", default="validation", help="the Task's split to decode (default validation)")
    seqio.add_argument("--num-examples", type=int, default=None, help="decode only the split's first N examples")
    p.set_defaults(func=run)


def _load(args):
    """(target, draft, tokenizer) from the arguments."""
    from specjax.checkpoints import load_checkpoint
    from specjax.tokenizer import Tokenizer

    lookup = args.draft == "prompt-lookup"
    if bool(args.target) != bool(args.draft) and not lookup:
        raise ValueError(
            "Give both --target and --draft checkpoints, or neither (to use the embedded default "
            "pair); --draft prompt-lookup needs no draft model."
        )
    if args.target:
        dtype = "float32" if args.dtype == "auto" else args.dtype
        draft_dtype = dtype if args.draft_dtype in (None, "auto") else args.draft_dtype
        target = load_checkpoint(args.target, dtype=dtype)
        draft = None if lookup else load_checkpoint(args.draft, dtype=draft_dtype)
        tokenizer, origin = _checkpoint_tokenizer(args)
        print(f"tokenizer: {origin}", file=sys.stderr)
        return target, draft, tokenizer
    try:
        import specjax

        load_default_pair = getattr(specjax, "load_default_pair", None)
        if load_default_pair is None:
            from specjax.defaults import load_default_pair
    except ImportError as e:
        raise ValueError(
            "No default model pair is available in this installation; pass --target and --draft "
            f"checkpoints (and --tokenizer). ({e})"
        ) from e
    kwargs = {"dtype": args.dtype} if args.dtype else {}
    if getattr(args, "draft_dtype", None):
        kwargs["draft_dtype"] = args.draft_dtype
    if args.size:
        kwargs["size"] = args.size
    target, draft, tokenizer = load_default_pair(**kwargs)
    if args.tokenizer:
        tokenizer = Tokenizer(args.tokenizer)
    return target, draft, tokenizer


def _checkpoint_tokenizer(args):
    """The vocabulary for --target/--draft and where it came from: --tokenizer (a SentencePiece file, or
    "byt5"), else the checkpoint's own (``spiece.model`` in the target's folder or the one above, where
    ``specjax convert`` and Hugging Face exports put it; ByT5's byte vocabulary for a ByT5 checkpoint), else
    T5's 32k model from ../shared/data (``specjax.tokenizer.resolve_tokenizer``)."""
    from specjax.tokenizer import resolve_tokenizer

    return resolve_tokenizer(args.target, args.tokenizer, DEFAULT_TOKENIZER)


def _read_lines(path: str) -> list[str]:
    """The input lines of ``path`` (stdin for "-", a Cloud Storage object for gs://), decoded as UTF-8; an
    undecodable line raises ValueError naming the file and line."""
    if path == "-":
        data = sys.stdin.buffer.read()
    elif path.startswith("gs://"):  # every host of a slice reads the same object (TensorStore's gcs driver)
        from specjax.checkpoints.t5x import read_gcs_bytes

        data = read_gcs_bytes(path)
    else:
        with open(path, "rb") as f:
            data = f.read()
    lines = data.splitlines()
    out = []
    for i, raw in enumerate(lines):
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            name = "stdin" if path == "-" else path
            raise ValueError(
                f"{name}, line {i + 1}: not UTF-8 text ({e.reason} at byte {e.start}); convert the "
                "file to UTF-8 (e.g. iconv -f latin1 -t utf-8)."
            ) from None
    return out


def _validate(args):
    from specjax.sampling import validate_sampling

    # The shipped pair translates; checkpoints of one's own may do any task (specjax.defaults.DECODE_DEFAULTS).
    resolve_decoding_defaults(
        args, "text" if args.target else "translation", fixed=bool(args.data_parallel or args.mesh or args.processes)
    )
    validate_sampling(args.temperature, args.top_k, args.top_p)
    auto = args.gamma == "auto" or args.gamma == 0
    if args.gamma == "auto" and (args.data_parallel or args.mesh or args.processes):
        raise ValueError(
            "--gamma auto measures its costs on one device (specjax.Decoder); with --data-parallel / --mesh / "
            "--processes give an int gamma (0: the target alone)."
        )
    for name in ("batch_size", "max_decode_length", "max_input_length") + (() if auto else ("gamma",)):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if not auto and args.gamma > args.max_decode_length:
        print(
            f"note: --gamma {args.gamma} is more than --max-decode-length {args.max_decode_length}; using gamma "
            f"{args.max_decode_length} (no iteration can use more drafts).",
            file=sys.stderr,
        )
        args.gamma = args.max_decode_length
    if args.input != "-" and not args.input.startswith("gs://") and not os.path.exists(args.input):
        raise FileNotFoundError(
            f"No input file {args.input!r}; pass a text file with one input per line, or - for stdin."
        )
    if args.input != "-" and os.path.isdir(args.input):
        raise ValueError(f"--input {args.input!r} is a directory; pass a text file with one input per line.")
    check_output_path(args.output)  # before any model loads: a missing directory, no permission, a read-only disk
    if args.output != "-" and os.path.abspath(args.output) == os.path.abspath(args.input):
        raise ValueError("--output must differ from --input.")


def _launch(args: argparse.Namespace) -> int:
    """``--processes N``: this command as N local JAX processes (``specjax.launch``); returns the exit status."""
    from specjax import launch
    from specjax.parallel import parse_mesh

    if args.processes < 1:
        raise ValueError(f"--processes must be >= 1, got {args.processes}.")
    devices = args.devices_per_process
    if devices is None:
        sizes = parse_mesh(args.mesh) if args.mesh else {"data": 1, "model": 1}
        total = sizes["data"] * sizes["model"]
        if total % args.processes:
            raise ValueError(
                f"--mesh {args.mesh} has {total} devices, which do not split over --processes {args.processes}; "
                "give a mesh whose size is a multiple of N (or --devices-per-process D)."
            )
        devices = total // args.processes

    def kept() -> str:
        if args.output == "-":
            return "lines already written to stdout stay written"
        return f"{lines_done(args.output)} whole lines are in {args.output}: run the same command again to resume"

    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    return launch.launch_local(argv, args.processes, devices, command="generate", after_failure=kept)


def run(args: argparse.Namespace) -> int:
    """Decodes every not-yet-written input line through the bulk decoder (``specjax.bulk``) and writes one line per
    input, in order, as each is done; returns 0. Raises ValueError/FileNotFoundError on bad input."""
    if args.seqio_task:
        if args.processes is not None:
            raise ValueError("--processes runs a file's decode (--input); with --seqio-task run it without.")
        from specjax.cli import seqio_generate

        return seqio_generate.run(args)
    if not args.input:
        raise ValueError("--input FILE is required (or --seqio-task NAME to decode a seqio Task's split).")
    _validate(args)
    if args.processes is not None and "SPECJAX_PROCESS_ID" not in os.environ:  # the launcher, not a process
        return _launch(args)
    lines = _read_lines(args.input)
    if not lines:
        raise ValueError(
            f"{'stdin' if args.input == '-' else args.input} has no lines; nothing to decode (one input per line)."
        )
    import contextlib
    import time

    from specjax import parallel
    from specjax.cli._common import phase_line, process_seconds

    started = process_seconds()  # import, argument checks and reading the input: before this
    t_run = time.perf_counter()

    mesh = None
    if args.data_parallel or args.mesh or args.processes:  # before anything touches a device
        parallel.maybe_initialize_distributed()  # a no-op on one process
        mesh = parallel.process_mesh(args.data_parallel, args.mesh)
    writer = parallel.is_process_zero()  # several processes: process 0 writes every line
    done = parallel.value_of_process_zero(lines_done(args.output) if writer else 0)
    report = sys.stderr  # statistics and progress; the outputs go to --output (stdout for -)
    if done >= len(lines):
        print(f"{args.output}: all {len(lines)} lines already written; nothing to do.", file=report)
        return 0
    if done and writer:
        print(f"{args.output}: {done} of {len(lines)} lines already written; resuming at line {done + 1}.", file=report)

    from specjax.bulk import BulkDecoder
    from specjax.cli import draft_source, speculative_kwargs

    spec_kwargs = speculative_kwargs(args)
    if writer:
        if not args.target:  # the shipped pair: say what it suits before its output is read as a translation
            print(f"note: {SHIPPED_PAIR_DOMAIN}", file=report)
        print("loading the models ...", file=report, flush=True)
    t_load = time.perf_counter()
    with parallel.host_loading() if mesh is not None else contextlib.nullcontext():  # a mesh places the slices
        target, draft, tokenizer = _load(args)
    load_seconds = time.perf_counter() - t_load
    draft = draft_source(args, draft)
    rows = encode_lines(tokenizer, lines[done:], args.prefix, args.max_input_length, args.truncate, first=done)
    blank = {i for i in range(done, len(lines)) if not lines[i].strip()}  # empty in, empty out (line alignment)
    if blank and writer:
        print(
            f"note: {len(blank)} empty input line(s) (first: line {min(blank) + 1}) get empty output lines, so "
            "output line i stays the decode of input line i.",
            file=report,
        )
    import jax

    # Slots come in multiples of the data axis of all processes (each process holds slots / processes).
    unit = (1 if mesh is None else mesh.shape[parallel.DATA]) * jax.process_count()
    slots = -(-args.batch_size // unit) * unit
    if slots != args.batch_size and writer:
        print(
            f"note: --batch-size {args.batch_size} rounded up to {slots} decode slots, a multiple of the data axis "
            f"({unit}); outputs do not depend on the slot count.",
            file=report,
        )
    slots = min(slots, -(-len(rows) // unit) * unit)  # a short file: fewer slots
    settings = dict(
        batch_size=slots // jax.process_count(),
        max_decode_length=args.max_decode_length,
        eos_id=tokenizer.eos_id,
        max_input_length=args.max_input_length,
        mesh=mesh,
    )
    sampling = dict(rng=args.seed, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, start_index=done)
    bulk = BulkDecoder(target, draft, gamma=args.gamma, **spec_kwargs, **settings)
    out, dropped = OutputLines(args.output) if writer else None, [0]  # the file is created with its first line
    write_seconds = 0.0
    try:
        progress = dict(total=len(lines), initial=done)
        for r in bulk.generate(rows, progress=progress, **sampling):
            if out is not None:  # flushed: a rerun resumes after it
                t_write = time.perf_counter()
                out.write(["" if r.index in blank else output_text(tokenizer, r.tokens, dropped)])
                write_seconds += time.perf_counter() - t_write
    finally:
        if out is not None:
            out.close()
    s = bulk.stats
    if args.verbose:
        for reason in s.reasons:
            print(reason, file=report)
        to_step = (
            None
            if started is None or s.first_step_seconds is None
            else (started + (time.perf_counter() - t_run) - (s.seconds - s.first_step_seconds))
        )
        print(
            phase_line(
                {
                    "import": started,
                    "load": load_seconds,
                    f"programs ({s.programs_built} built, {s.programs_loaded} loaded)": s.program_seconds,
                    "γ auto": s.gamma_seconds,
                    "decode": s.decode_seconds - write_seconds,
                    "write": write_seconds,
                    "process start to first decode step": to_step,
                }
            ),
            file=report,
        )
    gammas = ", ".join(f"γ {g}: {n}" for g, n in sorted(s.gammas.items()))
    fraction = s.accepted / s.drafted if s.drafted else float("nan")
    per_call = s.tokens / s.target_calls if s.target_calls else float("nan")
    share = "" if jax.process_count() == 1 else f" (this process's share of {len(rows)} lines)"
    print(
        f"lines {s.lines}{share}, tokens {s.tokens}, gamma {args.gamma} (runs by γ: {gammas}), temperature "
        f"{args.temperature}, {slots} slots",
        file=report,
    )
    drafting = (
        f"acceptance rate alpha {s.alpha:.3f} (the paper's, per token), accepted/drafted {fraction:.3f}, "
        if s.drafted
        else "no draft tokens (the target alone ran every line), "
    )
    print(
        f"{drafting}tokens per target call {per_call:.2f}, {s.tokens_per_second:.1f} tokens/s, "
        f"{s.lines / s.seconds:.2f} lines/s, first line after {s.first_line_seconds:.1f} s (wall time, compiles "
        "included)",
        file=report,
    )
    if args.compare_baseline:
        base = BulkDecoder((bulk.target_fns, bulk.target_params), None, gamma=0, **settings)  # params placed once
        for _ in base.generate(rows, **sampling):
            pass
        b = base.stats
        # Like with like: each side's decode time, its program builds / loads and γ auto's measuring left out
        # (one side may have built its programs in this run while the other loaded them from disk).
        print(
            f"baseline (the target alone, same slots) {b.tokens / max(b.decode_seconds, 1e-9):.1f} tokens/s, "
            f"speculative {s.tokens / max(s.decode_seconds, 1e-9):.1f} tokens/s, speedup "
            f"{b.decode_seconds / max(s.decode_seconds, 1e-9):.2f}x (decode time of the same inputs, both sides' "
            f"program builds and loads left out: {s.program_seconds + s.gamma_seconds:.1f} s speculative, "
            f"{b.program_seconds:.1f} s baseline)",
            file=report,
        )
    if dropped[0]:
        print(
            f"warning: {dropped[0]} generated ids beyond the tokenizer's vocabulary ({tokenizer.vocab_size}) were "
            "dropped from the text.",
            file=report,
        )
    return 0

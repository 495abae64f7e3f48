"""The ``specjax`` command: one subcommand per module in this package.

Each subcommand module defines ``add_parser(subparsers)`` (registers its arguments and sets
``func=run``) and ``run(args) -> int``. Modules are imported here but keep their heavy imports
inside ``run`` so ``specjax --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand name -> module under specjax.cli. Order is the order shown in --help.
SUBCOMMANDS = ("demo", "translate", "generate", "convert", "train", "bench", "aot")

# What the shipped pairs suit, said wherever a command offers them (--help of demo / translate / generate, the demo's
# first line): trained on Multi30k, they translate short image captions and garble other English.
SHIPPED_PAIR_DOMAIN = (
    "The shipped English->German pairs were trained on Multi30k image captions (short descriptions of a photo) and "
    "garble other text; for other text load a real T5 checkpoint with --target/--draft (Hugging Face or T5X "
    "directories, e.g. Flan-T5; docs/models.md)."
)


def add_decoding_args(
    p: argparse.ArgumentParser, *, task: str, seed_help: str = "PRNG seed for sampling", fixed_gamma_flags: str = ""
) -> None:
    """The speculative-sampling flags shared by subcommands: --gamma, --temperature, --top-k, --top-p,
    --max-decode-length (tokens) and --seed, with the defaults of ``specjax.defaults.DECODE_DEFAULTS``.

    ``--gamma`` and ``--max-decode-length`` default to None here; ``resolve_decoding_defaults(args, task)`` fills
    them in (γ "auto"; the task's length) once the subcommand knows its task. ``task``: "translation" or "text",
    as the help text shows it ("text" commands resolve to "translation" with the shipped pair).
    ``fixed_gamma_flags``: the subcommand's flags that compile one fixed γ (e.g. "--mesh / --data-parallel"), named
    in --gamma's help; empty for a subcommand without them.
    """
    from specjax.defaults import DECODE_DEFAULTS as D

    if task == "text":  # the shipped pair translates: "text" is the length with --target checkpoints
        lengths = (
            f"{D.max_decode_length['translation']} with the shipped pair, {D.max_decode_length['text']} with "
            "--target checkpoints"
        )
    else:
        lengths = str(D.max_decode_length[task])
    fixed = f" (with {fixed_gamma_flags} the default is {D.fixed_gamma})" if fixed_gamma_flags else ""
    p.add_argument(
        "--gamma",
        type=gamma_arg,
        default=None,
        help=f"draft tokens per target call: 'auto' (the default: chosen per call from measured costs and the "
        f"running alpha, specjax.Decoder; the target alone when that is faster), 0 (the target alone) or an int "
        f">= 1{fixed}",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="print gamma auto's choices and their reasons (stderr; generate: and the run's phases, seconds each)",
    )
    p.add_argument(
        "--temperature", type=float, default=D.temperature, help="0 = greedy (default); 1 = sample from the target"
    )
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep, in (0, 1] (default 1: all)")
    p.add_argument(
        "--max-decode-length",
        type=int,
        default=None,
        help=f"output tokens per line at most (default: {lengths})",
    )
    p.add_argument("--seed", type=int, default=D.seed, help=f"{seed_help} (default {D.seed})")
    p.add_argument(
        "--verification",
        choices=["token", "block"],
        default="token",
        help="token: Leviathan et al. 2023, Algorithm 1 (default); block: Sun et al. 2025 (never fewer "
        "accepted tokens in expectation, same output distribution)",
    )
    p.add_argument(
        "--draft-confidence-threshold",
        type=float,
        default=None,
        metavar="P",
        help="each row stops drafting after a draft token whose probability is below P, in [0, 1] "
        "(adaptive gamma up to --gamma; default: off)",
    )
    p.add_argument(
        "--max-ngram", type=int, default=3, help="with --draft prompt-lookup: the longest n-gram matched (default 3)"
    )


def resolve_decoding_defaults(args, task: str, *, fixed: bool = False) -> None:
    """Fills in the decoding flags left unset (None) from ``specjax.defaults.DECODE_DEFAULTS``: ``--gamma`` "auto"
    (``fixed_gamma`` when ``fixed``: a mesh or data-parallel run compiles one γ) and ``--max-decode-length`` the
    task's ("translation" or "text"). Changes ``args`` in place."""
    from specjax.defaults import DECODE_DEFAULTS as D

    if getattr(args, "gamma", None) is None:
        args.gamma = D.fixed_gamma if fixed else D.gamma
    if getattr(args, "max_decode_length", None) is None:
        args.max_decode_length = D.max_decode_length[task]


def gamma_arg(value: str):
    """``--gamma``'s type: "auto" or an int >= 0 (0: the target alone). Raises argparse.ArgumentTypeError."""
    if value == "auto":
        return value
    try:
        g = int(value)
    except ValueError:
        g = -1
    if g < 0:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an int >= 0 (0: the target alone), got {value!r}")
    return g


def make_decoder(args, target, draft, **settings):
    """A ``specjax.Decoder`` for ``--gamma`` (auto, 0 or an int), the shared flags' static settings and
    ``settings`` (``max_input_length``, ``eos_id``, ``truncate``)."""
    from specjax.decoder import Decoder

    return Decoder(
        target,
        draft,
        gamma=args.gamma,
        max_decode_length=args.max_decode_length,
        **speculative_kwargs(args),
        **settings,
    )


def add_size_arg(p: argparse.ArgumentParser) -> None:
    """``--size mini|small``: which shipped pair (``specjax.load_default_pair(size=...)``) a subcommand uses
    without --target/--draft; default: ``specjax.defaults.default_size()`` ("small")."""
    p.add_argument(
        "--size",
        choices=["mini", "small"],
        default=None,
        help="which shipped pair: small (46.0M-parameter target, BLEU 31.6, about 2x speedup on a CPU; "
        "the default) or mini (13.5M, BLEU 25.6: fast per token, little speedup on a CPU)",
    )


def draft_source(args, draft):
    """The draft the flags ask for: ``specjax.PromptLookupDraft(max_ngram=--max-ngram)`` when ``--draft
    prompt-lookup`` was given (no draft model), else the loaded draft model unchanged."""
    if getattr(args, "draft", None) == "prompt-lookup":
        from specjax.decoding import PromptLookupDraft

        return PromptLookupDraft(max_ngram=args.max_ngram)
    return draft


def speculative_kwargs(args) -> dict:
    """``speculative_sample`` keywords of the shared flags that only speculative decoding takes.

    Raises:
      ValueError: ``--draft-confidence-threshold`` outside [0, 1] or together with ``--draft prompt-lookup``.
    """
    c = args.draft_confidence_threshold
    if c is not None and not 0.0 <= c <= 1.0:
        raise ValueError(f"--draft-confidence-threshold must be in [0, 1], got {c}; try 0.3 to 0.6.")
    if c is not None and getattr(args, "draft", None) == "prompt-lookup":
        raise ValueError(
            "--draft-confidence-threshold needs a draft model; a prompt-lookup proposal has no "
            "confidence (drop one of the two flags)."
        )
    return dict(verification=args.verification, draft_confidence_threshold=c)


def build_parser() -> argparse.ArgumentParser:
    """The top-level argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="specjax", description="Speculative sampling for T5 in JAX (Leviathan et al. 2023, Algorithm 1)."
    )
    from specjax import __version__

    parser.add_argument("--version", action="version", version=f"specjax {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"specjax.cli.{name}")
        except ModuleNotFoundError as e:  # a subcommand not written yet
            if e.name == f"specjax.cli.{name}":
                continue
            raise
        module.add_parser(sub)
    for p in _subparsers(parser).values():
        add_cache_args(p)
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    """{subcommand name: its parser}."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _subcommand_parser(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser:
    """The parser of subcommand ``name`` (the top-level parser when there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """``--cache-dir DIR`` and ``--no-cache``: where the command keeps XLA's compiled programs and γ auto's measured
    costs between runs (``specjax.cli._common.cache_settings``), on every subcommand."""
    g = p.add_argument_group("caches kept between runs")
    g.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=None,
        help="keep the decode programs, compiled (DIR/programs/: a later run loads them, nothing traced or "
        "compiled), XLA's persistent compilation cache (DIR/xla/; $JAX_COMPILATION_CACHE_DIR, if set, instead) and "
        "gamma auto's measured costs (DIR/costs.json) here (default: $SPECJAX_CACHE_DIR, else ~/.cache/specjax)",
    )
    g.add_argument(
        "--no-cache",
        action="store_true",
        help="keep nothing between runs: compile every program and measure gamma auto's costs again "
        "(also SPECJAX_CACHE_DIR=off)",
    )


def main(argv=None) -> int:
    """Entry point of the ``specjax`` console script. Returns the process exit status.

    One of several JAX processes (``jax.distributed``; a slice's hosts, ``--processes N``) that fails leaves at
    once with its status (``os._exit``, after its message or traceback), without waiting at JAX's shutdown barrier
    for processes that are still decoding: they stop when the coordination service (or ``--processes``' launcher)
    sees it gone.

    An error argparse finds in a subcommand's arguments (an unknown flag, a missing or bad value) prints that
    subcommand's usage and a one-line message; one the subcommand finds (a ``ValueError``) or the operating system
    reports (any ``OSError``: a missing file or directory, permissions, a full disk; ``_common.os_error_line``
    names the path and the fix) prints one line, "specjax COMMAND: error: ..."; both on stderr, exit status 2.
    Ctrl-C at any moment exits with status 130 and one line, finished lines kept (``_common.
    install_interrupt_handler``). Before the subcommand runs: libtpu is kept quiet on a host without a TPU and the
    caches kept between runs are turned on (``--cache-dir``, ``--no-cache``). Results go to stdout, statistics and
    progress to stderr.
    """
    try:
        status = _main(argv)
    except SystemExit as e:
        if _several_processes():
            _leave(e.code if isinstance(e.code, int) else 1)
        raise
    except BaseException:
        if _several_processes():
            import traceback

            traceback.print_exc()
            _leave(1)
        raise
    if status and _several_processes():
        _leave(status)
    return status


def _several_processes() -> bool:
    """True in one of several JAX processes (the distributed runtime initialized, ``jax.process_count() > 1``)."""
    jax = sys.modules.get("jax")
    try:
        return jax is not None and jax.distributed.is_initialized() and jax.process_count() > 1
    except Exception:  # a half-started runtime: not one that can hold the others up
        return False


def _leave(status: int) -> None:
    """Flushes stdout and stderr and ends the process with ``status`` now (``os._exit``)."""
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def _main(argv=None) -> int:
    """``main`` on one process."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    command = getattr(args, "command", None)
    if unknown:  # argparse would blame the top-level parser: the subcommand's usage is the useful one
        _subcommand_parser(parser, command).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line, as a launcher repeats it
    import signal

    from specjax import _command
    from specjax.cli import _common

    previous = signal.getsignal(signal.SIGINT)
    _common.install_interrupt_handler(command)
    try:
        _common.quiet_libtpu()
        _common.enable_caches(getattr(args, "cache_dir", None), getattr(args, "no_cache", False))
        status = int(args.func(args) or 0)
        _common.flush_stdout()
        return status
    except ValueError as e:
        print(f"specjax {command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"specjax {command}: error: {_common.os_error_line(e)}", file=sys.stderr)
        try:
            _common.flush_stdout()
        except OSError:  # stdout itself failed (a full disk, a closed pipe): drop what it still holds
            _common.discard_stdout()
        return 2
    except KeyboardInterrupt:  # raised by a handler of a subcommand's own (train's second Ctrl-C)
        print(f"specjax {command}: interrupted; finished work was kept.", file=sys.stderr)
        return _common.INTERRUPT_EXIT
    finally:
        if not _command.running_as_command():  # main() called from Python (a test, a notebook): theirs again
            signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    sys.exit(main())
